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
from loadtest.harness.measure import measure
from loadtest.harness.report import NAN, Column, Row, Table
from loadtest.harness.service import service_env
from loadtest.loadgen import Answer, CellResult, closed_loop
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess, free_port

PROTOCOLS = ("http", "grpc", "grpc tei")
COLUMNS = (
    Column("sentences/s", 12, ".0f", "sentences_per_s"),
    "p50 ms",
    Column("server µs/sentence", 19, ".0f", "cpu_us"),
    Column("client cores", 13, ".2f", "client_cores"),
    Column("errors", 7, "d", "errors"),
)
TABLE = Table("protocol", 10, *COLUMNS, tail="")


def grpc_drive(
    port: int, corpus: list[str], c: Cell, start: int
) -> Callable[[float, float], Coroutine[Any, Any, CellResult]]:
    """The load of ``c`` over gRPC: ``zhembed.v1`` Embed, or TEI's EmbedStream (``grpc tei``)."""
    import grpc

    from app.api.rpc.proto import tei_pb2, tei_pb2_grpc, zhembed_pb2, zhembed_pb2_grpc

    async def drive(duration: float, warmup: float) -> CellResult:
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


def main(argv: list[str] | None = None) -> int:
    quick = "8 clients × 4 texts, 2 s cells, one round (CI)"
    p = parser("loadtest.grpc_http", __doc__, quick, model=None, duration=10.0, warmup=3.0)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--texts", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
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
        print(TABLE.header)
        rows: list[Row] = []
        with ServiceProcess("app", env, Path(tempfile.gettempdir()) / "zhembed-grpc-http.log") as svc:
            for k, protocol in enumerate(PROTOCOLS * args.rounds):
                c, start = Cell(args.clients, args.texts, protocol=protocol), k * STRIDE
                bodies = distinct_bodies(corpus, c.texts, start)
                drive = None if protocol == "http" else grpc_drive(grpc_port, corpus, c, start)
                m = measure(svc, c, bodies, args.duration, args.warmup, None, drive=drive)
                rows.append(Row.of(m, label=protocol))
                print(TABLE.row(rows[-1], ""), flush=True)
    http = [r for r in rows if r.label == "http"]
    for protocol in PROTOCOLS[1:]:
        pairs = list(zip([r for r in rows if r.label == protocol], http, strict=True))
        ratio = np.mean([(o.sentences_per_s or NAN) / (h.sentences_per_s or NAN) for o, h in pairs])
        cpu = np.mean([o.cpu_us / h.cpu_us for o, h in pairs])
        print(f"{protocol} / http: sentences/s {ratio:.2f}x, server CPU per sentence {cpu:.2f}x")
    return 1 if any(r.errors or not r.sentences_per_s for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
