"""The load generator of every benchmark: closed-loop clients (:func:`closed_loop`), over raw HTTP/1.1 on
keep-alive asyncio streams (:func:`run_cell`) or over gRPC on one ``grpc.aio`` channel (:func:`run_grpc_cell`).

Not httpx: the client shares the CPU with the server, and httpx spends ~150 µs of Python a request; this
client a fraction of that, and its own CPU time is reported.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

# Makes the n-th request body and says how many texts it carries.
BodyFactory = Callable[[int], tuple[bytes, int]]


@dataclass
class CellResult:
    """What one (target, workload, concurrency) cell measured."""

    wall_s: float
    requests: int
    sentences: int
    errors: int
    latencies_ms: list[float] = field(repr=False)
    client_cpu_s: float
    status_counts: dict[int, int]
    first_error: str | None = None

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.wall_s if self.wall_s else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def client_cores(self) -> float:
        """CPU cores the client itself used during the measured window (1.0 = one full core)."""
        return self.client_cpu_s / self.wall_s if self.wall_s else 0.0

    @classmethod
    def pooled(cls, results: list[CellResult]) -> CellResult:
        """Several windows of one load as one: their counts over their summed windows, every latency."""
        statuses: Counter[int] = Counter()
        for r in results:
            statuses.update(r.status_counts)
        return cls(
            wall_s=sum(r.wall_s for r in results),
            requests=sum(r.requests for r in results),
            sentences=sum(r.sentences for r in results),
            errors=sum(r.errors for r in results),
            latencies_ms=[ms for r in results for ms in r.latencies_ms],
            client_cpu_s=sum(r.client_cpu_s for r in results),
            status_counts=dict(statuses),
            first_error=next((r.first_error for r in results if r.first_error), None),
        )


def cycle(bodies: list[bytes], texts: int) -> BodyFactory:
    """A factory that sends ``bodies`` round and round, each carrying ``texts`` texts."""
    return lambda n: (bodies[n % len(bodies)], texts)


class HttpError(RuntimeError):
    pass


# How a request on a connection fails without an answer (the connection is then closed).
FAILED = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError)


class _Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time, as an HTTP library keeps one, counted:
    an answer with ``Connection: close`` closes it; a reused connection the server closed while idle is
    reopened before the next request (``reopened``); a request on a reused connection that the server
    closes before any byte of an answer is sent again, once, on a new one (``retried``; ``last_retried``:
    the latest request was), and a second failure raises, as a fresh connection's does. ``received``:
    whether any byte of the latest request's answer came back.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.answered = 0  # requests answered on the current connection: 0 = a fresh one
        self.reopened = 0
        self.retried = 0
        self.last_retried = False
        self.received = False
        self.head = b""  # the latest answer's status line and headers

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is not None and self.reader.at_eof():  # closed by the server while idle
            self.close()
            self.reopened += 1
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
            self.answered = 0
        return self.reader, self.writer

    @property
    def local_port(self) -> int | None:
        """This end's port while connected (what the server sees as the client's port)."""
        if self.writer is None:
            return None
        name = self.writer.get_extra_info("sockname")
        return int(name[1]) if name else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
        self.answered = 0

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, bytes]:
        """``headers``: extra header lines, each ending in CRLF (e.g. ``"Priority: u=7\\r\\n"``)."""
        self.last_retried = False
        try:
            return await self._request(method, path, body, headers)
        except (ConnectionError, asyncio.IncompleteReadError):
            if self.received or self.answered == 0:
                raise
        # A reused connection closed under the request before any answer: once more, on a new one.
        self.close()
        self.retried += 1
        self.last_retried = True
        return await self._request(method, path, body, headers)

    async def _request(self, method: str, path: str, body: bytes, headers: str) -> tuple[int, bytes]:
        self.received = False
        reader, writer = await self._open()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            self.received = bool(exc.partial)
            raise
        self.received = True
        self.head = raw
        first, *lines = raw.split(b"\r\n")
        status = int(first.split(b" ", 2)[1])
        fields = {k.strip().lower(): v.strip().lower() for k, _, v in (x.partition(b":") for x in lines)}
        if b"content-length" not in fields:  # every server here sends one (none answers chunked)
            raise HttpError(f"{method} {path}: response has no Content-Length")
        payload = await reader.readexactly(int(fields[b"content-length"]))
        self.answered += 1
        if b"close" in fields.get(b"connection", b""):
            self.close()
        return status, payload


@dataclass(frozen=True)
class Outcome:
    """How one request ended: its HTTP status (None: no answer, or not HTTP), the texts it answered, the
    error when it failed, and the answer's head (status line and headers)."""

    status: int | None
    texts: int
    error: str | None = None
    head: bytes = b""


# A client's request: the n-th request of the cell (n counts across clients), sent and answered.
Call = Callable[[int], Awaitable[Outcome]]


async def closed_loop(
    client: Callable[[], AbstractAsyncContextManager[Call]],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    drain_s: float = 30.0,
    answered: Callable[[bytes], None] | None = None,
) -> CellResult:
    """``concurrency`` clients (each ``client()``, open while it runs), each sending its next request when the
    last is answered, for ``warmup_s + duration_s``. Only requests that end in the last ``duration_s``
    count (those in flight then are drained, up to ``drain_s``); ``answered`` gets each one's head."""
    counter: Iterator[int] = itertools.count()
    result = CellResult(duration_s, 0, 0, 0, [], 0.0, {})
    # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds.
    now = time.perf_counter
    measure_from = now() + warmup_s
    deadline = measure_from + duration_s

    async def worker() -> None:
        async with client() as call:
            while now() < deadline:
                sent = now()
                got = await call(next(counter))
                ended = now()
                if not measure_from <= ended <= deadline:
                    continue
                if got.status is not None:
                    result.status_counts[got.status] = result.status_counts.get(got.status, 0) + 1
                if got.error is not None:
                    result.errors += 1
                    result.first_error = result.first_error or got.error
                    continue
                result.requests += 1
                result.sentences += got.texts
                result.latencies_ms.append((ended - sent) * 1000.0)
                if answered is not None:
                    answered(got.head)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(max(0.0, measure_from - now()))
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, deadline - now()))
    result.client_cpu_s = time.process_time() - cpu0
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return result


async def run_cell(
    host: str,
    port: int,
    path: str,
    make_body: BodyFactory,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    drain_s: float = 30.0,
    check: Callable[[bytes, int], bool] | None = None,
    headers: dict[str, str] | None = None,
    answered: Callable[[bytes], None] | None = None,
) -> CellResult:
    """:func:`closed_loop` over HTTP: ``concurrency`` keep-alive connections POSTing ``make_body(n)`` (the
    n-th request's body and its texts; n counts across connections) to ``path`` with ``headers`` added
    (e.g. ``{"Priority": "u=7"}``); ``check(payload, texts)`` False counts a 200 answer as an error."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())

    @asynccontextmanager
    async def client() -> AsyncIterator[Call]:
        conn = _Connection(host, port)

        async def call(n: int) -> Outcome:
            body, texts = make_body(n)
            try:
                status, payload = await conn.request("POST", path, body, extra)
            except FAILED as exc:
                conn.close()
                return Outcome(None, 0, f"{type(exc).__name__}: {exc}")
            if status != 200:
                return Outcome(status, 0, f"HTTP {status}: {payload[:200]!r}")
            if check is not None and not check(payload, texts):
                return Outcome(status, 0, f"bad answer: {payload[:200]!r}")
            return Outcome(status, texts, head=conn.head)

        try:
            yield call
        finally:
            conn.close()

    return await closed_loop(client, concurrency, duration_s, warmup_s, drain_s, answered)


async def run_grpc_cell(
    host: str,
    port: int,
    texts_of: Callable[[int], list[str]],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    tei: bool = False,
) -> CellResult:
    """:func:`closed_loop` over gRPC, every client on one channel: the n-th call embeds ``texts_of(n)`` with
    ``zhembed.v1``'s Embed, or (``tei``) with TEI's EmbedStream, one text a message."""
    import grpc

    from app.api.rpc.proto import tei_pb2, tei_pb2_grpc, zhembed_pb2, zhembed_pb2_grpc

    async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
        ours, theirs = zhembed_pb2_grpc.ZhembedStub(channel), tei_pb2_grpc.EmbedStub(channel)

        async def call(n: int) -> Outcome:
            batch = texts_of(n)
            try:
                if tei:
                    messages = iter([tei_pb2.EmbedRequest(inputs=t, normalize=True) for t in batch])
                    return Outcome(None, len([a async for a in theirs.EmbedStream(messages) if a.embeddings]))
                answer = await ours.Embed(zhembed_pb2.EmbedRequest(inputs=batch))
            except grpc.RpcError as exc:
                return Outcome(None, 0, f"{type(exc).__name__}: {exc}")
            return Outcome(None, len(answer.vectors))

        return await closed_loop(lambda: nullcontext(call), concurrency, duration_s, warmup_s)
