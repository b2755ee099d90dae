"""The gRPC rows of the loop-lag probe (issue 50): each gRPC method's heaviest request the limits allow,
sent while ``GET /health`` is probed on the same worker; ``/health``'s p50 and p99 while it runs.

    python -m loadtest.loop_lag_grpc [--model models/bert-base-chinese-twin] [--cwd ../main]
                                     [--methods Tokenize,Decode] [--repeat 3] [--quick]

``grpc_rows(settings)`` gives the rows (method, the request in words, a coroutine function that sends it on
a channel) for a probe that already drives HTTP routes; run alone, each row is sent ``--repeat`` times in
a row while another process probes ``/health`` every 5 ms, and a line per row is printed. ``--cwd`` runs another
checkout's server (``python -m app`` imports from there first): the same rows before and after a change.
A row whose request is refused says so (what the server answered); its lag is measured all the same.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.settings import Settings
from loadtest.harness import TWIN, parser
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess, free_port

# Requests of one stream that run at once on the server (app.api.rpc.calls.STREAM_WINDOW).
WINDOW = 32
SENTENCE = "北京是中国的首都，今天天气很好。这家餐厅的菜很好吃，服务也很周到。"


@dataclass(frozen=True)
class GrpcRow:
    method: str
    request: str  # the heaviest allowed request, in words
    send: Callable[[Any], Awaitable[str]]  # on a grpc.aio channel; what the server answered, in words


def _text(chars: int) -> str:
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def grpc_rows(settings: Settings) -> list[GrpcRow]:
    """Each gRPC method's heaviest request within ``settings``' limits (a message of ``max_body_bytes``
    where a method has no other bound), as a row of the loop-lag probe."""
    import grpc

    from app.api.rpc.proto import tei_pb2 as pb
    from app.api.rpc.proto import tei_pb2_grpc as rpc
    from app.api.rpc.proto import zhembed_pb2 as zpb
    from app.api.rpc.proto import zhembed_pb2_grpc as zrpc

    chars, inputs = settings.max_input_chars, settings.max_inputs_per_request
    longest = _text(chars)
    ids = (np.arange(chars + 2) % 20000 + 100).tolist()  # as many ids as the longest input has tokens
    # A message of max_body_bytes: 3-byte varints of ids in the vocabulary.
    body_ids = [16384 + i % 4000 for i in range(settings.max_body_bytes // 3 - 16)]
    masked = "北京是中国的首都" + "[MASK]" * 128

    def unary(stub: str, method: str, message: Callable[[], Any], service: Any = rpc) -> Any:
        async def send(channel: Any) -> str:
            try:
                await getattr(getattr(service, stub)(channel), method)(message())
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {(exc.details() or '')[:80]}"
            return "OK"

        return send

    def streamed(stub: str, method: str, messages: Callable[[], list[Any]], service: Any = rpc) -> Any:
        async def send(channel: Any) -> str:
            try:
                call = getattr(getattr(service, stub)(channel), method)(iter(messages()))
                if hasattr(call, "__aiter__"):
                    async for _ in call:
                        pass
                else:
                    await call
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {(exc.details() or '')[:80]}"
            return "OK"

        return send

    def encode() -> Any:
        return pb.EncodeRequest(inputs=longest, add_special_tokens=True)

    return [
        GrpcRow("tei Tokenize", f"one input of {chars} chars", unary("TokenizeStub", "Tokenize", encode)),
        GrpcRow(
            "tei TokenizeStream",
            f"{WINDOW} inputs of {chars} chars",
            streamed("TokenizeStub", "TokenizeStream", lambda: [encode()] * WINDOW),
        ),
        GrpcRow(
            "tei Decode",
            f"{len(body_ids)} ids (a {settings.max_body_bytes >> 20} MiB message)",
            unary("TokenizeStub", "Decode", lambda: pb.DecodeRequest(ids=body_ids)),
        ),
        GrpcRow(
            "tei Decode",
            f"{len(ids)} ids (the longest input's tokens)",
            unary("TokenizeStub", "Decode", lambda: pb.DecodeRequest(ids=ids)),
        ),
        GrpcRow(
            "tei DecodeStream",
            f"{WINDOW} x {len(ids)} ids",
            streamed("TokenizeStub", "DecodeStream", lambda: [pb.DecodeRequest(ids=ids)] * WINDOW),
        ),
        GrpcRow(
            "tei RerankStream",
            f"{inputs + 1} texts of {chars} chars (one over the limit)",
            streamed(
                "RerankStub",
                "RerankStream",
                lambda: [pb.RerankStreamRequest(query="首都", text=longest)] * (inputs + 1),
            ),
        ),
        GrpcRow(
            "tei Embed",
            f"one input of {chars} chars, truncated",
            unary("EmbedStub", "Embed", lambda: pb.EmbedRequest(inputs=longest, truncate=True)),
        ),
        GrpcRow(
            "tei EmbedAll",
            f"one input of {chars} chars, truncated (the model's length in token vectors)",
            unary("EmbedStub", "EmbedAll", lambda: pb.EmbedAllRequest(inputs=longest, truncate=True)),
        ),
        GrpcRow(
            "tei EmbedAllStream",
            f"{WINDOW} inputs of {chars} chars, truncated",
            streamed(
                "EmbedStub",
                "EmbedAllStream",
                lambda: [pb.EmbedAllRequest(inputs=longest, truncate=True)] * WINDOW,
            ),
        ),
        GrpcRow(
            "zhembed Embed",
            f"{inputs} inputs of {chars} chars, long_text truncate",
            unary(
                "ZhembedStub",
                "Embed",
                lambda: zpb.EmbedRequest(
                    inputs=[longest] * inputs, options=zpb.EmbedOptions(long_text="truncate")
                ),
                zrpc,
            ),
        ),
        GrpcRow(
            "zhembed FillMask",
            "one input with 128 masks, top_k 50",
            unary("ZhembedStub", "FillMask", lambda: zpb.FillMaskRequest(inputs=[masked], top_k=50), zrpc),
        ),
    ]


def probe(port: int, ready: Any, stop: Any, out: Any) -> None:
    """``GET /health`` every 5 ms until ``stop`` is set (``ready`` once the first has answered), each
    answer's seconds put on ``out`` (in a process of its own: neither this process's event loop nor its
    GIL delays a probe)."""
    lags = []
    with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=60) as client:
        client.get("/health").raise_for_status()
        ready.set()
        while not stop.is_set():
            started = time.perf_counter()
            client.get("/health").raise_for_status()
            lags.append(time.perf_counter() - started)
            time.sleep(0.005)
    out.put(lags)


async def measure(row: GrpcRow, grpc_port: int, http_port: int, repeat: int) -> tuple[str, list[float]]:
    import grpc

    spawn = multiprocessing.get_context("spawn")
    ready, stop, out = spawn.Event(), spawn.Event(), spawn.Queue()
    async with grpc.aio.insecure_channel(
        f"{HOST}:{grpc_port}",
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    ) as channel:
        await row.send(channel)  # once before: connections and first-use costs out of the figures
        prober = spawn.Process(target=probe, args=(http_port, ready, stop, out))
        prober.start()
        await asyncio.to_thread(ready.wait, 120)
        try:
            answers = [await row.send(channel) for _ in range(repeat)]
        finally:
            stop.set()
            lags: list[float] = out.get()
            prober.join()
    return answers[-1], lags


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "loadtest.loop_lag_grpc", __doc__, quick="the tiny model (exported into a temp dir)", model=TWIN
    )
    p.add_argument("--cwd", type=Path, default=None, help="the checkout whose server runs (default: this)")
    p.add_argument("--methods", default="", help="comma-separated row methods to run (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="times each row's request is sent while probed")
    args = p.parse_args(argv)
    wanted = {m.strip() for m in args.methods.split(",") if m.strip()}
    with ExitStack() as stack:
        model = stack.enter_context(tiny_model()) if args.quick else args.model.resolve()
        settings = Settings(model=str(model))
        grpc_port = free_port()
        env = service_env(model, "fp32", 512, grpc_port=grpc_port, intra_op_threads=1, warmup=False)
        log = Path(tempfile.gettempdir()) / f"zhembed-loop-lag-grpc-{time.time_ns()}.log"
        svc = stack.enter_context(ServiceProcess("app", env, log, cwd=args.cwd))
        print(f"{'method':20} {'request':58} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  answer", flush=True)
        for row in grpc_rows(settings):
            if wanted and row.method.split()[-1] not in wanted:
                continue
            answer, lags = asyncio.run(measure(row, grpc_port, svc.port, args.repeat))
            ms = np.asarray(lags) * 1e3
            p50, p99 = np.percentile(ms, [50, 99])
            print(
                f"{row.method:20} {row.request:58} {p50:7.1f} {p99:7.1f} {ms.max():7.1f}  {answer}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
