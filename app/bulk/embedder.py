"""The service's own engine for a bulk job: rows in, the vectors ``POST /embed`` returns for them out.

The same machinery as the server, built the way :mod:`app.serving.factory` builds it: the model, the
:class:`~app.engine.engine.Engine` (tokenisation thread, batch planner, inference thread) and the
:class:`~app.tasks.service.Service`, whose ``embeddings.rows`` makes each vector as the routes'
``vectors`` does (prompts, windows of long texts, Dense modules, layer arithmetic, normalisation). The
job keeps ``window`` texts in the engine at once, in calls of :data:`CALL_TEXTS`: the batch planner
cuts each batch from everything queued, grouped by length, so batches carry almost no padding, and a
call's answer comes back soon after its texts ran, so results stream out in order.

Bad rows never stop the job: :meth:`~app.tasks.embeddings.Embeddings.rows` prepares a call's texts as a
request's are prepared (:mod:`app.tasks.prepare`) and answers, in the same engine call, the vectors of
the good ones and, for each text the API would refuse, its problem in the API's own words, naming the
text by ``--text-field``; the job records those and writes the rest.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from app.bulk.output import SparseMode
from app.bulk.sources import Rows
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.errors import ValidationFailed
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings
from app.tasks.options import EmbedOptions, Names
from app.tasks.service import Service
from app.tasks.sparse import SparseRows, SparseVector
from app.telemetry.metrics import Metrics

# Texts per engine call: small, so that a call's answer is ready soon after its texts ran (results
# stream out in input order behind the oldest call), large enough that a call's own cost (a job, a
# future, a wake-up of the event loop) is small per text.
CALL_TEXTS = 64
# What to do about a text over the model's length, in the job's terms (the API's says what to send).
TOO_LONG_BULK = "run with --long-text truncate or --long-text chunk to embed it anyway"

T = TypeVar("T")


@dataclass
class Embedded:
    """One call's answer: the positions (in its rows) of the rows embedded, their vectors and tokens, and
    what is wrong with each of the others."""

    keep: list[int]
    vectors: np.ndarray  # float32 [len(keep), width] ([len(keep), 0] with --sparse-only)
    tokens: np.ndarray  # int32 [len(keep)]: [CLS], [SEP] and the prompt included, before any truncation
    bad: dict[int, str]
    sparse: list[SparseVector] | None = None  # with --sparse or --sparse-only: the rows' sparse vectors


def engine_settings(settings: Settings, window: int) -> Settings:
    """``settings`` for the job's engine: room for ``window`` texts in flight, no cache, no warm-up."""
    room = window + 2 * CALL_TEXTS
    return settings.model_copy(
        update={
            "max_concurrent_inputs": max(room, settings.max_concurrent_inputs),
            "max_inputs_per_request": max(CALL_TEXTS, settings.max_inputs_per_request),
            "cache_bytes": 0,
            "redis_url": None,
            "warmup": False,
        }
    )


class Embedder:
    """The model, engine and service of one job (one per process, or per Ray actor)."""

    def __init__(
        self,
        settings: Settings,
        given: dict[str, Any],
        text_field: str,
        window: int,
        model: OnnxModel | None = None,
        sparse: SparseMode = "off",
        top_k: int | None = None,
    ) -> None:
        """Load the model the settings name (unless ``model`` is given) and start the engine.

        Args:
            settings: the model, variant, providers, threads and batching, as the service reads them.
            given: the ``EmbedOptions`` fields given on the command line; the model's defaults for the rest.
            text_field: how messages name a text (``--text-field``).
            window: texts in the engine at once.
            sparse: also (``beside``) or only (``only``) each row's sparse vector, as ``/embed_sparse``
                answers it with the same ``long_text`` and ``truncation_direction``.
            top_k: with ``sparse``, only each vector's ``top_k`` largest weights.

        Raises:
            ManifestError: the model cannot be loaded.
        """
        self.settings = engine_settings(settings, window)
        self.window = window
        self.field = text_field
        self.given = given
        self.sparse: SparseMode = sparse
        self.top_k = top_k
        self.model = model if model is not None else load_model(self.settings)
        metrics = Metrics()
        self.engine = Engine(self.model, self.settings, metrics)
        self.engine.start()
        self.service = Service(self.settings, self.model, self.engine, VectorCache(None, None, metrics))
        self.service.ready = True
        self.options: EmbedOptions = replace(self.service.defaults, **given)
        self.width = self.service.embeddings.width  # until check(): the model's own width

    def close(self) -> None:
        self.engine.stop()

    async def check(self) -> None:
        """Embed one text with the job's options, through the same path as every row: the options are
        checked against the model here, once, before any input is read, and the vectors' width learnt.

        Raises:
            ValidationFailed, Unsupported, EmptyInput: the options do not fit the model.
        """
        if self.sparse != "off":
            self.service.sparse.check(self.options.long_text, self.top_k)
        if self.sparse == "only":
            dense_only = sorted(set(self.given) - {"long_text", "truncation_direction"})
            if dense_only:
                flags = ", ".join("--" + name.replace("_", "-") for name in dense_only)
                raise ValidationFailed(
                    f"{flags}: dense-vector options, and --sparse-only makes no dense vectors"
                )
            self.width = 0
            return
        got = await self.service.embeddings.rows(["检查"], self.options, self._names(), TOO_LONG_BULK)
        self.width = int(got.vectors.shape[1])  # concatenated layers make it a multiple of the model's

    async def stream(self, items: Iterable[tuple[T, Rows]]) -> AsyncIterator[tuple[T, Rows, Embedded]]:
        """Each item's rows embedded, in calls of at most :data:`CALL_TEXTS`, ``window`` texts in flight,
        yielded in order: (the item's tag, a call's rows, their answer)."""
        pending: deque[tuple[T, Rows, asyncio.Future[Embedded]]] = deque()
        queued = 0
        source = iter(items)
        broken: Exception | None = None
        try:
            while True:
                try:
                    tag, rows = next(source)
                except StopIteration:
                    break
                except Exception as exc:  # an unreadable input: what was read before it is still embedded
                    broken = exc
                    break
                for start in range(0, len(rows), CALL_TEXTS):
                    part = rows.slice(start, start + CALL_TEXTS) if len(rows) > CALL_TEXTS else rows
                    pending.append((tag, part, asyncio.ensure_future(self.embed(part))))
                    queued += len(part)
                    while queued > self.window:
                        tag_, done, future = pending.popleft()
                        queued -= len(done)
                        yield tag_, done, await future
            while pending:
                tag_, done, future = pending.popleft()
                yield tag_, done, await future
        finally:
            for _, _, future in pending:
                future.cancel()
        if broken is not None:
            raise broken

    async def embed(self, rows: Rows) -> Embedded:
        """The vectors of ``rows``' good texts, and why each of the others is refused: one engine call
        (two with --sparse: the sparse graph's pass over the rows the dense one kept)."""
        bad = dict(rows.bad)
        todo = [i for i, text in enumerate(rows.texts) if text is not None and i not in bad]
        if self.sparse == "only":
            kept, sparse = await self._sparse(rows, todo, bad)
            return Embedded(
                kept,
                np.empty((len(kept), 0), np.float32),
                sparse.tokens.astype(np.int32),
                bad,
                sparse.vectors,
            )
        texts = [rows.texts[i] or "" for i in todo]
        got = await self.service.embeddings.rows(texts, self.options, self._names(), TOO_LONG_BULK)
        bad.update((todo[k], problem.message) for k, problem in got.problems.items())
        keep = [i for k, i in enumerate(todo) if k not in got.problems]
        tokens = got.tokens.astype(np.int32)
        if self.sparse == "off":
            return Embedded(keep, got.vectors, tokens, bad)
        kept, sparse = await self._sparse(rows, keep, bad)
        good = np.isin(keep, kept)  # the same rules as the dense pass: it keeps them all, unless a prompt
        return Embedded(kept, got.vectors[good], tokens[good], bad, sparse.vectors)

    async def _sparse(self, rows: Rows, todo: list[int], bad: dict[int, str]) -> tuple[list[int], SparseRows]:
        """The sparse vectors of ``rows``' texts at ``todo``: the positions kept and the answer; the
        others' problems go into ``bad``."""
        sparse = await self.service.sparse.rows(
            [rows.texts[i] or "" for i in todo],
            self.options.long_text,
            self.options.truncation_direction,
            self._names(),
            TOO_LONG_BULK,
            self.top_k,
        )
        bad.update((todo[k], problem.message) for k, problem in sparse.problems.items())
        return [i for k, i in enumerate(todo) if k not in sparse.problems], sparse

    def _names(self) -> Names:
        return Names(self.field, lambda _i: self.field)
