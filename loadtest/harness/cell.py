"""What a cell sends: closed-loop clients × texts per request, on one route and protocol, at one urgency;
the request bodies of distinct texts that no cache or de-duplication can serve from another; and several
cells' clients run at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from loadtest.corpus import distinct_texts
from loadtest.loadgen import BodyFactory, CellResult, run_cell
from loadtest.server import HOST

# Each cell's texts start this far past the previous cell's: new to the service too.
STRIDE = 10_000_000


@dataclass(frozen=True)
class Cell:
    """``clients`` closed-loop clients, each request ``texts`` texts, in ``encoding``; ``urgency`` is the
    request's ``Priority: u=N`` (None: the service's default), ``model`` the model it names in a service
    of several (None: the only one)."""

    clients: int
    texts: int
    encoding: str = "float"
    route: str = "/embed"
    protocol: str = "http"  # http | grpc | grpc tei
    urgency: int | None = None
    model: str | None = None

    @property
    def label(self) -> str:
        return f"{self.clients}x{self.texts}" + ("" if self.encoding == "float" else f" {self.encoding}")

    @property
    def inputs(self) -> int:
        """Inputs in flight when every client waits for an answer."""
        return self.clients * self.texts

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.urgency is None else {"Priority": f"u={self.urgency}"}


def parse_cells(text: str) -> list[Cell]:
    """``"8x32,32x1"`` → ``[Cell(8, 32), Cell(32, 1)]`` (clients x texts per request)."""
    cells = []
    for part in text.split(","):
        clients, _, texts = part.strip().partition("x")
        cells.append(Cell(int(clients), int(texts)))
    return cells


def distinct_bodies(
    corpus: list[str],
    texts: int,
    start: int,
    encoding: str = "float",
    route: str = "/embed",
    model: str | None = None,
) -> BodyFactory:
    """The bodies of :func:`distinct_texts` as ``route`` takes them: one text as a string, more as a list; on
    /rerank a query and ``texts`` documents, cut to the model's length (as a search sends them) rather than
    refused. ``encoding`` and ``model`` (the model it names in a service of several) where given."""
    extra = {k: v for k, v in (("encoding", encoding), ("model", model)) if v not in ("float", None)}
    rerank = route == "/rerank"
    texts_of = distinct_texts(corpus, texts + 1 if rerank else texts, start)  # on /rerank, the query first

    def make(n: int) -> tuple[bytes, int]:
        batch = texts_of(n)
        if rerank:
            return orjson.dumps({"query": batch[0], "texts": batch[1:], "truncate": True, **extra}), texts
        return orjson.dumps({"inputs": batch[0] if texts == 1 else batch, **extra}), texts

    return make


def answered_vectors(payload: bytes, _texts: int) -> bool:
    return payload[:1] == b"["  # cheap: the client shares the cores with the server


async def closed_loops(
    loads: Iterable[tuple[int, Cell, BodyFactory]], duration_s: float, warmup_s: float
) -> list[CellResult]:
    """Every HTTP cell's clients at once, each load ``(port, cell, its bodies)``; each cell's result. An
    answer after the window does not count: one still in flight gets 5 s, then is cancelled."""
    return await asyncio.gather(
        *(
            run_cell(HOST, port, c.route, make, c.clients, duration_s, warmup_s, 5.0, headers=c.headers)
            for port, c, make in loads
        )
    )
