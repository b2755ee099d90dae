"""CPU per request of the HTTP layer alone: the app as uvicorn calls it, in-process, no sockets.

    python -m loadtest.http_path [--requests 3000] [--repeats 5]

The app from ``create_app`` with a stub service, driven by ASGI calls. Rows: ``/embed`` with 1 text and
with 32 texts, floats and base64, and the harness alone; µs of CPU per request (median and least over
``--repeats``) for the app as served and for the same request behind the data path. docs/performance.md
says what it counts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import uvloop
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.http.fast import DataPath
from app.serving.factory import create_app
from app.settings import Settings
from app.tasks.answers import Answer
from app.tasks.options import EmbedOptions
from app.telemetry.timings import Timings
from loadtest.harness import parser

WIDTH = 768


class StubService:
    """What the routes call on /embed: the answer is computed before the request comes."""

    def __init__(self, texts: int) -> None:
        rng = np.random.default_rng(0)
        vectors = rng.standard_normal((texts, WIDTH)).astype(np.float32)
        self.value = list(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        self.timings = Timings(queue_ms=0.4, tokenization_ms=0.03, inference_ms=1.2, total_ms=1.7)
        self.ready = True
        self.kind = "embedding"
        self.defaults = EmbedOptions()
        self.embeddings = self  # the routes call service.embeddings.embed

    async def embed(self, inputs: Any, options: Any) -> Answer[Any]:
        # As the engine's answer does, this one comes on a later turn of the event loop.
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        loop.call_soon(answered.set_result, None)
        await answered
        return Answer(self.value, self.timings)


@dataclass(frozen=True)
class Case:
    name: str
    texts: int
    encoding: str


CASES = (Case("1 text", 1, "float"), Case("32 texts", 32, "float"), Case("32 texts, base64", 32, "base64"))


def _scope(body: bytes) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/embed",
        "raw_path": b"/embed",
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


async def _one(app: ASGIApp, scope: dict[str, Any], body: bytes) -> int:
    """One request as uvicorn's httptools protocol serves it; the status."""
    done = asyncio.Event()
    read = False
    status = 0

    async def receive() -> Message:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # uvicorn: nothing more until the client leaves or the response is over
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            done.set()

    await app(dict(scope), receive, send)
    return status


async def _measure(app: ASGIApp, case: Case, requests: int, repeats: int) -> list[float]:
    texts = [f"第{i}句：今天天气很好，我们去公园散步吧。" for i in range(case.texts)]
    body = orjson.dumps({"inputs": texts[0] if case.texts == 1 else texts, "encoding": case.encoding})
    scope = _scope(body)
    for _ in range(200):  # warm-up
        status = await _one(app, scope, body)
        assert status == 200, status
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(requests):
            await _one(app, scope, body)
        runs.append((time.process_time() - started) / requests * 1e6)
    return runs


def build(texts: int) -> FastAPI:
    app = create_app(Settings(model="unused: a stub service", warmup=False, cache_bytes=0))
    app.state.service = StubService(texts)  # as the lifespan would, without loading a model
    return app


def through_stack(app: FastAPI) -> ASGIApp:
    """The middleware stack and FastAPI behind the data path, as FastAPI would call them."""
    front = app.middleware_stack
    if not isinstance(front, DataPath):
        raise RuntimeError(f"create_app put {type(front).__name__} in front, not the data path")
    inner = front.app

    async def stack(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app
        await inner(scope, receive, send)

    return stack


async def _null(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"[]"})


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.http_path", __doc__)
    p.add_argument("--requests", type=int, default=3000, help="requests per run (a third for 32 texts)")
    p.add_argument("--repeats", type=int, default=5, help="runs per cell; the median is reported")
    args = p.parse_args(argv)
    print(f"HTTP layer, µs of CPU per request: median of {args.repeats} runs (min)")
    print(f"  {'':<18} {'the app':>18} {'stack + FastAPI':>18}")
    for case in CASES:
        app = build(case.texts)
        n = args.requests if case.texts == 1 else max(args.requests // 3, 1)
        cells = []
        for target in (app, through_stack(app)):
            runs = uvloop.run(_measure(target, case, n, args.repeats))
            cells.append(f"{statistics.median(runs):9.1f} ({min(runs):6.1f})")
        print(f"  {case.name:<18} {cells[0]:>18} {cells[1]:>18}")
    runs = uvloop.run(_measure(_null, CASES[0], args.requests, args.repeats))
    print(f"  {'(this harness)':<18} {statistics.median(runs):9.1f} ({min(runs):6.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
