"""The same load over gRPC and over HTTP: sentences/s and server CPU per sentence (issue 21).

    python -m loadtest.grpc_http [--model DIR] [--clients 256] [--texts 32] [--duration 10] [--warmup 3]
                                 [--rounds 2] [--quick]

One ``python -m app`` serves both protocols (``ZHEMBED_GRPC_PORT``; cache off, one intra-op thread,
admission above the load), on the tiny 4-layer model of :mod:`loadtest.overhead` unless ``--model``.
Each round runs the HTTP cell (``POST /embed``, :mod:`loadtest.loadgen`'s raw HTTP/1.1 client) and then
the gRPC cells (``zhembed.v1.Zhembed/Embed`` with the same inputs, and text-embeddings-inference's
``tei.v1.Embed/EmbedStream`` with one text per message): ``--clients`` closed-loop clients, each request
``--texts`` distinct texts, so no cache or de-duplication serves one from another. The gRPC clients are
``grpc.aio`` calls on one channel, in this process. Per cell: sentences/s, p50, server CPU per sentence
(utime + stime of the server over the cell / sentences answered) and the client's cores (it shares the
machine with the server). Rounds interleave the protocols so that drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness.cell import STRIDE, Cell, distinct_bodies
from loadtest.harness.measure import Measured, measure
from loadtest.harness.service import service_env
from loadtest.loadgen import CellResult
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess, free_port

PROTOCOLS = ("http", "grpc", "grpc tei")


async def _grpc_cell(
    call: Callable[[int], Awaitable[int]], clients: int, duration_s: float, warmup_s: float
) -> CellResult:
    """Closed-loop ``call(n)`` (returns the sentences answered) on ``clients`` tasks, measured as
    :func:`loadtest.loadgen.run_cell` measures HTTP."""
    counter = itertools.count()
    latencies: list[float] = []
    totals = {"requests": 0, "sentences": 0, "errors": 0}
    start = time.perf_counter()
    measure_from, deadline = start + warmup_s, start + warmup_s + duration_s
    cpu: list[float] = []

    async def client() -> None:
        while (now := time.perf_counter()) < deadline:
            try:
                answered = await call(next(counter))
            except Exception:
                totals["errors"] += 1
                continue
            if now >= measure_from:
                latencies.append((time.perf_counter() - now) * 1000)
                totals["requests"] += 1
                totals["sentences"] += answered

    async def mark() -> None:
        await asyncio.sleep(warmup_s)
        cpu.append(time.process_time())

    marker = asyncio.create_task(mark())
    await asyncio.gather(*(client() for _ in range(clients)))
    await marker
    client_cpu = time.process_time() - cpu[0]
    return CellResult(
        clients,
        duration_s,
        totals["requests"],
        totals["sentences"],
        totals["errors"],
        latencies,
        client_cpu,
        {},
    )


def grpc_drive(
    port: int, corpus: list[str], c: Cell, start: int, duration: float, warmup: float
) -> Callable[[], Coroutine[Any, Any, CellResult]]:
    """The load of ``c`` over gRPC: ``zhembed.v1`` Embed, or TEI's EmbedStream (``grpc tei``)."""
    import grpc

    from app.api.rpc.proto import tei_pb2, tei_pb2_grpc, zhembed_pb2, zhembed_pb2_grpc

    async def drive() -> CellResult:
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            ours = zhembed_pb2_grpc.ZhembedStub(channel)
            theirs = tei_pb2_grpc.EmbedStub(channel)

            async def call(n: int) -> int:
                batch = unique_texts(corpus, start + n * c.texts, c.texts)
                if c.protocol == "grpc tei":
                    stream = theirs.EmbedStream(
                        iter([tei_pb2.EmbedRequest(inputs=t, normalize=True) for t in batch])
                    )
                    return len([a async for a in stream if a.embeddings])
                answer = await ours.Embed(zhembed_pb2.EmbedRequest(inputs=batch))
                return len(answer.vectors)

            return await _grpc_cell(call, c.clients, duration, warmup)

    return drive


def server_us(m: Measured) -> float:
    """Server CPU over the whole cell (warm-up and drain included) per sentence answered in it, estimated
    from the measured rate times the cell's length."""
    answered = m.load.sentences_per_s * m.wall_s
    return m.server_cpu_s / answered * 1e6 if answered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.grpc_http", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="an exported model folder (default: tiny)")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="8 clients × 4 texts, 2 s cells, one round (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.texts, args.duration, args.warmup, args.rounds = 8, 4, 2.0, 0.5, 1
    corpus = load_corpus()
    grpc_port = free_port()
    cores = len(os.sched_getaffinity(0))
    with tiny_model(args.model) as model:
        inputs = args.clients * args.texts
        more = {"intra_op_threads": 1, "grpc_port": grpc_port, "max_inputs_per_request": max(64, args.texts)}
        env = service_env(model, "fp32", 2 * inputs, **more)
        print(
            f"zhembed gRPC vs HTTP: {model}; {args.clients} clients × {args.texts} texts, {args.duration:g} s "
            f"cells (+{args.warmup:g} s warm-up), {args.rounds} round(s); {cores} cores shared by client and server"
        )
        rows: list[Measured] = []
        with ServiceProcess("app", env, Path(tempfile.gettempdir()) / "zhembed-grpc-http.log") as svc:
            for k, protocol in enumerate(PROTOCOLS * args.rounds):
                c, start = Cell(args.clients, args.texts, protocol=protocol), k * STRIDE
                drive = (
                    None
                    if protocol == "http"
                    else grpc_drive(grpc_port, corpus, c, start, args.duration, args.warmup)
                )
                bodies = distinct_bodies(corpus, c.texts, start)
                rows.append(measure(svc, c, bodies, args.duration, args.warmup, None, False, drive))
        print(
            f"{'protocol':<10} {'sentences/s':>12} {'p50 ms':>8} {'server µs/sentence':>19} {'client cores':>13} {'errors':>7}"
        )
        for r in rows:
            print(
                f"{r.cell.protocol:<10} {r.load.sentences_per_s:>12.0f} {r.load.percentile(50):>8.1f} "
                f"{server_us(r):>19.0f} {r.load.client_cores:>13.2f} {r.load.errors:>7}"
            )
        http = [r for r in rows if r.cell.protocol == "http"]
        for protocol in PROTOCOLS[1:]:
            ours = [r for r in rows if r.cell.protocol == protocol]
            pairs = list(zip(ours, http, strict=True))
            ratio = np.mean([o.load.sentences_per_s / h.load.sentences_per_s for o, h in pairs])
            cpu = np.mean([server_us(o) / server_us(h) for o, h in pairs])
            print(f"{protocol} / http: sentences/s {ratio:.2f}x, server CPU per sentence {cpu:.2f}x")
    return 1 if any(r.load.errors or not r.load.sentences_per_s for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
