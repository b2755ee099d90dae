"""The same load over gRPC and over HTTP: sentences/s and server CPU per sentence.

    python -m loadtest.grpc_http [--model DIR] [--clients 256] [--texts 32] [--duration 10] [--warmup 3]
                                 [--rounds 2] [--quick]

Per round, a row per protocol (HTTP ``POST /embed``, gRPC ``zhembed.v1`` Embed, TEI's EmbedStream):
sentences/s, p50, server µs per sentence and the client's cores, on the tiny model unless ``--model``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Coroutine
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness import parser
from loadtest.harness.cell import STRIDE, Cell, distinct_bodies
from loadtest.harness.measure import Measured, measure
from loadtest.harness.service import service_env
from loadtest.loadgen import Answer, CellResult, closed_loop
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess, free_port

PROTOCOLS = ("http", "grpc", "grpc tei")


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

            async def call(n: int) -> Answer:
                batch = unique_texts(corpus, start + n * c.texts, c.texts)
                try:
                    if c.protocol == "grpc tei":
                        messages = iter([tei_pb2.EmbedRequest(inputs=t, normalize=True) for t in batch])
                        answers = [a async for a in theirs.EmbedStream(messages) if a.embeddings]
                        return Answer(None, len(answers))
                    answer = await ours.Embed(zhembed_pb2.EmbedRequest(inputs=batch))
                except grpc.RpcError as exc:
                    return Answer(None, 0, f"{type(exc).__name__}: {exc}")
                return Answer(None, len(answer.vectors))

            return await closed_loop(lambda: nullcontext(call), c.clients, duration, warmup)

    return drive


def server_us(m: Measured) -> float:
    """Server CPU over the whole cell (warm-up and drain included) per sentence answered in it, estimated
    from the measured rate times the cell's length."""
    answered = m.load.sentences_per_s * m.wall_s
    return m.server_cpu_s / answered * 1e6 if answered else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.grpc_http", __doc__)
    p.add_argument("--model", type=Path, default=None, help="an exported model folder (default: tiny)")
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--texts", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="8 clients × 4 texts, 2 s cells, one round (CI)")
    args = p.parse_args(argv)
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
