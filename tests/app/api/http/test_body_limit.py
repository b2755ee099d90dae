"""413 for bodies over the limit, without reading them all: a declared length as the gates check it, a
streamed body as :func:`~app.api.http.body_limit.limited` counts it for every route but the data path's
(whose :func:`~app.api.http.body_limit.read_body` ``test_fast.py`` tests)."""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from app.api.drain import Drain
from app.api.http.body_limit import declared_length
from app.api.http.gates import GateMiddleware, Gates
from app.telemetry.metrics import Metrics


async def echo_length(scope: Scope, receive: Receive, send: Send) -> None:
    body = await Request(scope, receive).body()
    await JSONResponse({"length": len(body)})(scope, receive, send)


def call(headers: list[tuple[bytes, bytes]], chunks: list[bytes], limit: int) -> tuple[int, dict, int]:
    """Status, JSON body, and how many chunks the app pulled."""
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        pulled += 1
        more = pulled < len(chunks)
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": more}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    gates = Gates(metrics=Metrics(), drain=Drain(), keys=None, max_body_bytes=limit)
    asyncio.run(GateMiddleware(echo_length, gates, frozenset(), frozenset())(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled


def test_declared_length_over_the_limit_is_refused_unread() -> None:
    status, body, pulled = call([(b"content-length", b"5000")], [b"x" * 5000], limit=1000)
    assert status == 413 and body["error_type"] == "payload_too_large"
    assert pulled == 0


def test_streamed_body_is_cut_off_once_over_the_limit() -> None:
    status, body, pulled = call([], [b"x" * 400] * 10, limit=1000)
    assert status == 413 and body["error_type"] == "payload_too_large"
    assert pulled == 3  # stopped at the chunk that crossed the limit, not the 10th


def test_bodies_within_the_limit_pass() -> None:
    status, body, _ = call([(b"content-length", b"800")], [b"x" * 400] * 2, limit=1000)
    assert status == 200 and body == {"length": 800}


def test_a_malformed_declared_length_is_left_to_the_stream_count() -> None:
    assert declared_length(b"800") == 800
    assert declared_length(b"8e2") == 0 and declared_length(b"") == 0
    status, body, pulled = call([(b"content-length", b"lots")], [b"x" * 400] * 10, limit=1000)
    assert status == 413 and body["error_type"] == "payload_too_large" and pulled == 3
