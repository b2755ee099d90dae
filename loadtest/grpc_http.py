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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import uvloop

from loadtest import loadgen
from loadtest.corpus import load_corpus, unique_texts
from loadtest.quick_model import export_tiny
from loadtest.server import HOST, ServiceProcess, free_port

LAYERS = 4


@dataclass
class Row:
    protocol: str
    sentences_per_s: float
    p50_ms: float
    server_us_per_sentence: float
    client_cores: float
    errors: int


async def _grpc_cell(
    call: Callable[[int], Awaitable[int]], clients: int, duration_s: float, warmup_s: float
) -> tuple[float, list[float], int, int, float]:
    """Closed-loop ``call(n)`` (returns the sentences answered) on ``clients`` tasks; (wall, latencies,
    sentences, errors, client CPU s) over the measured window."""
    counter = itertools.count()
    latencies: list[float] = []
    totals = {"sentences": 0, "errors": 0}
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
                totals["sentences"] += answered

    async def mark() -> None:
        await asyncio.sleep(warmup_s)
        cpu.append(time.process_time())

    marker = asyncio.create_task(mark())
    await asyncio.gather(*(client() for _ in range(clients)))
    await marker
    return duration_s, latencies, totals["sentences"], totals["errors"], time.process_time() - cpu[0]


def run_grpc(
    port: int,
    corpus: list[str],
    clients: int,
    texts: int,
    start: int,
    duration: float,
    warmup: float,
    tei: bool,
) -> tuple[float, list[float], int, int, float]:
    import grpc

    from app.api.rpc.proto import tei_pb2, tei_pb2_grpc, zhembed_pb2, zhembed_pb2_grpc

    async def main() -> tuple[float, list[float], int, int, float]:
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            ours = zhembed_pb2_grpc.ZhembedStub(channel)
            theirs = tei_pb2_grpc.EmbedStub(channel)

            async def call(n: int) -> int:
                batch = unique_texts(corpus, start + n * texts, texts)
                if tei:
                    stream = theirs.EmbedStream(
                        iter([tei_pb2.EmbedRequest(inputs=t, normalize=True) for t in batch])
                    )
                    return len([a async for a in stream if a.embeddings])
                answer = await ours.Embed(zhembed_pb2.EmbedRequest(inputs=batch))
                return len(answer.vectors)

            return await _grpc_cell(call, clients, duration, warmup)

    return uvloop.run(main())


def run_http(
    port: int, corpus: list[str], clients: int, texts: int, start: int, duration: float, warmup: float
) -> tuple[float, list[float], int, int, float]:
    def make(n: int) -> tuple[bytes, int]:
        return orjson.dumps({"inputs": unique_texts(corpus, start + n * texts, texts)}), texts

    result = uvloop.run(loadgen.run_cell(HOST, port, "/embed", make, clients, duration, warmup))
    return result.wall_s, result.latencies_ms, result.sentences, result.errors, result.client_cpu_s


def measure(
    svc: ServiceProcess,
    protocol: str,
    grpc_port: int,
    corpus: list[str],
    args: argparse.Namespace,
    start: int,
) -> Row:
    cpu0, t0 = svc.cpu_seconds(), time.perf_counter()
    if protocol == "http":
        wall, latencies, sentences, errors, client_cpu = run_http(
            svc.port, corpus, args.clients, args.texts, start, args.duration, args.warmup
        )
    else:
        wall, latencies, sentences, errors, client_cpu = run_grpc(
            grpc_port,
            corpus,
            args.clients,
            args.texts,
            start,
            args.duration,
            args.warmup,
            protocol == "grpc tei",
        )
    cpu = svc.cpu_seconds() - cpu0
    elapsed = time.perf_counter() - t0
    # Server CPU over the whole cell (warm-up and drain included) per sentence answered in it, estimated
    # from the measured rate times the cell's length.
    rate = sentences / wall if wall else 0.0
    answered = rate * elapsed
    return Row(
        protocol=protocol,
        sentences_per_s=rate,
        p50_ms=float(np.percentile(latencies, 50)) if latencies else float("nan"),
        server_us_per_sentence=cpu / answered * 1e6 if answered else float("nan"),
        client_cores=client_cpu / wall if wall else 0.0,
        errors=errors,
    )


@contextmanager
def _model(folder: Path | None) -> Iterator[Path]:
    if folder is not None:
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="zhembed-grpc-") as tmp:
        yield export_tiny(Path(tmp) / "source", Path(tmp) / "model", ("fp32",), LAYERS)[0]


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
    with _model(args.model) as model:
        env = {
            "ZHEMBED_MODEL": str(model),
            "ZHEMBED_VARIANT": "fp32",
            "ZHEMBED_LOG_LEVEL": "warning",
            "ZHEMBED_CACHE_BYTES": "0",
            "ZHEMBED_INTRA_OP_THREADS": "1",
            "ZHEMBED_GRPC_PORT": str(grpc_port),
            "ZHEMBED_MAX_CONCURRENT_INPUTS": str(max(512, 2 * args.clients * args.texts)),
            "ZHEMBED_MAX_INPUTS_PER_REQUEST": str(max(64, args.texts)),
        }
        print(
            f"zhembed gRPC vs HTTP: {model}; {args.clients} clients × {args.texts} texts, {args.duration:g} s "
            f"cells (+{args.warmup:g} s warm-up), {args.rounds} round(s); {cores} cores shared by client and server"
        )
        rows: list[Row] = []
        with ServiceProcess("app", env, Path(tempfile.gettempdir()) / "zhembed-grpc-http.log") as svc:
            start = 0
            for _ in range(args.rounds):
                for protocol in ("http", "grpc", "grpc tei"):
                    rows.append(measure(svc, protocol, grpc_port, corpus, args, start))
                    start += 10_000_000
        print(
            f"{'protocol':<10} {'sentences/s':>12} {'p50 ms':>8} {'server µs/sentence':>19} {'client cores':>13} {'errors':>7}"
        )
        for r in rows:
            print(
                f"{r.protocol:<10} {r.sentences_per_s:>12.0f} {r.p50_ms:>8.1f} {r.server_us_per_sentence:>19.0f} "
                f"{r.client_cores:>13.2f} {r.errors:>7}"
            )
        for protocol in ("grpc", "grpc tei"):
            ours = [r for r in rows if r.protocol == protocol]
            http = [r for r in rows if r.protocol == "http"]
            ratio = np.mean([o.sentences_per_s / h.sentences_per_s for o, h in zip(ours, http, strict=True)])
            cpu = np.mean(
                [o.server_us_per_sentence / h.server_us_per_sentence for o, h in zip(ours, http, strict=True)]
            )
            print(f"{protocol} / http: sentences/s {ratio:.2f}x, server CPU per sentence {cpu:.2f}x")
    return 1 if any(r.errors or not r.sentences_per_s for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
