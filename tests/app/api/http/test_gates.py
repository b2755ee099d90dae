"""The gates: the API key, the urgency and the declared body size in one pass over the headers, in that
order, after draining; and the middleware that runs them for every route but the data path's."""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.api.auth import ApiKeys
from app.api.drain import Drain
from app.api.http.gates import GateMiddleware, Gates
from app.engine.priority import URGENCY
from app.errors import PayloadTooLarge, Unauthorized
from app.telemetry.metrics import Metrics

LIMIT = 1000
KEYS = ApiKeys.from_entries((("bulk", 7), ("live", None)))
BULK = (b"authorization", b"Bearer bulk")
LIVE = (b"authorization", b"Bearer live")


def gates(drain: Drain | None = None) -> Gates:
    return Gates(metrics=Metrics(), drain=drain or Drain(), keys=KEYS, max_body_bytes=LIMIT)


def admitted(headers: list[tuple[bytes, bytes]], keys: ApiKeys | None = KEYS) -> tuple[bytes | None, int]:
    """What :meth:`Gates.admit` returns for ``headers`` and the urgency it leaves, in a request's own
    context (as a request's task has)."""

    def admit() -> tuple[bytes | None, int]:
        return gates().admit({"headers": headers}, keys), URGENCY.get()

    return contextvars.copy_context().run(admit)


def test_a_request_without_a_valid_key_is_refused() -> None:
    for headers, words in [
        ([], "no API key"),
        ([(b"authorization", b"Basic abc")], "malformed"),
        ([(b"authorization", b"Bearer nope")], "unknown API key"),
    ]:
        with pytest.raises(Unauthorized) as caught:
            admitted(headers)
        assert words in caught.value.message


def test_the_first_authorization_line_is_the_one_checked() -> None:
    assert admitted([LIVE, (b"authorization", b"Bearer nope")])[1] == 3
    with pytest.raises(Unauthorized):
        admitted([(b"authorization", b"Bearer nope"), LIVE])


def test_without_keys_to_check_none_is_needed() -> None:
    assert admitted([], keys=None) == (None, 3)
    assert admitted([(b"authorization", b"Bearer nope")], keys=None) == (None, 3)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([LIVE], 3),
        ([BULK], 7),  # the key's default
        ([LIVE, (b"priority", b"u=6")], 6),
        ([BULK, (b"priority", b"u=2")], 2),  # the request's own urgency wins
        ([BULK, (b"priority", b"u=9")], 7),  # out of range: ignored, so the key's default
        ([LIVE, (b"priority", b"U=1")], 3),  # not a Dictionary: ignored whole
        ([LIVE, (b"priority", b"u=1, @x")], 3),
        ([LIVE, (b"priority", b"\xff")], 3),
        ([LIVE, (b"priority", b"i"), (b"priority", b"u=1")], 1),  # two lines, one field (RFC 9110 §5.3)
        ([BULK, (b"priority", b"u=1"), (b"priority", b"U=2")], 7),  # one bad line spoils the field
    ],
)
def test_the_urgency_is_the_headers_else_the_keys_default_else_three(
    headers: list[tuple[bytes, bytes]], expected: int
) -> None:
    assert admitted(headers)[1] == expected


def test_a_declared_length_over_the_limit_is_refused_once_the_urgency_is_known() -> None:
    over = (b"content-length", str(LIMIT + 1).encode())
    with pytest.raises(PayloadTooLarge, match=f"limit of {LIMIT} bytes"):
        admitted([LIVE, over])
    urgency: list[int] = []

    def admit() -> None:
        try:
            gates().admit({"headers": [BULK, over]}, KEYS)
        finally:
            urgency.append(URGENCY.get())

    with pytest.raises(PayloadTooLarge):
        contextvars.copy_context().run(admit)
    assert urgency == [7]  # counted at the urgency it asked for
    assert admitted([LIVE, (b"content-length", str(LIMIT).encode())]) == (None, 3)
    with pytest.raises(Unauthorized):  # the key before the size
        admitted([over])


def test_the_content_type_comes_back_from_the_same_pass() -> None:
    headers = [LIVE, (b"content-type", b"application/json"), (b"content-type", b"text/plain")]
    assert admitted(headers) == (b"application/json", 3)


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"x-urgency", b"%d" % URGENCY.get())]}
    )
    await send({"type": "http.response.body", "body": b"{}"})


def serve(
    middleware: GateMiddleware, path: str, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[bytes, bytes], Any]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": headers, "query_string": b""}
    asyncio.run(middleware(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body)


def test_the_middleware_runs_the_gates_in_order_and_counts_each_request_once() -> None:
    drain = Drain()
    chain = gates(drain)
    middleware = GateMiddleware(
        ok, chain, routes=frozenset({"/info", "/health"}), open_paths=frozenset({"/health"})
    )
    requests = chain.metrics.requests
    assert serve(middleware, "/info", [BULK])[:2] == (200, {b"x-urgency": b"7"})
    status, headers, body = serve(middleware, "/info", [])
    assert (
        status == 401 and headers[b"www-authenticate"] == b"Bearer" and body["error_type"] == "unauthorized"
    )
    assert serve(middleware, "/health", [(b"priority", b"u=1")])[:2] == (200, {b"x-urgency": b"1"})  # open
    assert serve(middleware, "/nope", [])[0] == 401
    assert requests.labels("/info", "200", "http", "7")._value.get() == 1
    assert requests.labels("/info", "401", "http", "3")._value.get() == 1
    assert requests.labels("/health", "200", "http", "1")._value.get() == 1
    assert requests.labels("unmatched", "401", "http", "3")._value.get() == 1
    assert chain.metrics.failures.labels("unauthorized")._value.get() == 2
    drain.begin()
    status, headers, body = serve(middleware, "/info", [])  # draining comes before the key
    assert status == 503 and headers[b"connection"] == b"close" and body["error_type"] == "unhealthy"
    status, headers, _ = serve(middleware, "/health", [])
    assert status == 200 and headers[b"connection"] == b"close"
    assert requests.labels("/info", "503", "http", "3")._value.get() == 1
