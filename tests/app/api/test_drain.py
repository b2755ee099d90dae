"""The drain, as the gates apply it to every route but the data path's (which ``http/test_fast.py`` tests):
after the signal, 503 for new work, and every response closes its connection; while a worker retires,
every response closes its connection and nothing is refused."""

from __future__ import annotations

import asyncio
import json

from starlette.types import Message, Receive, Scope, Send

from app.api.drain import Drain
from app.api.http.gates import GateMiddleware, Gates
from app.telemetry.metrics import Metrics


def call(drain: Drain, path: str, begin_during_request: bool = False) -> tuple[int, dict[bytes, bytes], dict]:
    """Status, headers and JSON body of one request through the middleware."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if begin_during_request:
            drain.begin()  # the signal arrives while this request runs
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    gates = Gates(metrics=Metrics(), drain=drain, keys=None, max_body_bytes=1 << 20)
    middleware = GateMiddleware(app, gates, routes=frozenset(), open_paths=frozenset())
    asyncio.run(middleware(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body)


def test_before_the_signal_requests_pass_untouched() -> None:
    status, headers, body = call(Drain(), "/embed")
    assert status == 200 and body == {"ok": True} and b"connection" not in headers


def test_while_draining_new_work_and_readiness_get_503_and_close() -> None:
    drain = Drain()
    drain.begin()
    for path in ("/embed", "/ready", "/v1/embeddings"):
        status, headers, body = call(drain, path)
        assert status == 503 and headers[b"connection"] == b"close", path
        assert "shutting down" in json.dumps(body), path


def test_while_draining_liveness_and_metrics_still_answer() -> None:
    drain = Drain()
    drain.begin()
    for path in ("/health", "/metrics"):
        status, headers, _ = call(drain, path)
        assert status == 200 and headers[b"connection"] == b"close", path


def test_a_request_accepted_before_the_signal_finishes_and_closes_its_connection() -> None:
    drain = Drain()
    status, headers, body = call(drain, "/embed", begin_during_request=True)
    assert status == 200 and body == {"ok": True}
    assert headers[b"connection"] == b"close"
    assert drain.draining and drain.elapsed() >= 0


def test_while_retiring_everything_is_answered_and_every_connection_closes() -> None:
    drain = Drain()
    drain.retire()
    for path in ("/embed", "/ready", "/v1/embeddings", "/health"):
        status, headers, body = call(drain, path)
        assert status == 200 and body == {"ok": True}, path
        assert headers[b"connection"] == b"close", path
    assert not drain.draining
