"""The data path: its routes come from the API's own declarations, and it answers exactly as the
middleware stack and FastAPI behind it would, in-process (no sockets) with a stub service."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from starlette.types import ASGIApp, Message

from app.api.http.fast import BODY_PIECE, DataPath, fast_routes, send_body
from app.api.http.openai_routes import router as openai_router
from app.api.http.openai_schemas import OpenAIEmbeddingRequest
from app.api.http.routes import router
from app.api.schemas.embeddings import EmbedRequest
from app.engine.priority import URGENCY
from app.errors import FAULT_MESSAGE
from app.serving.factory import create_app
from app.settings import Settings
from app.tasks.answers import Answer
from app.tasks.options import EmbedOptions
from app.telemetry.timings import Timings

LIMIT = 64 * 1024
JSON = [(b"content-type", b"application/json")]


def test_every_post_data_route_and_only_those_is_served_fast() -> None:
    routes = fast_routes(router, openai_router)
    assert sorted(routes) == [
        "/",
        "/embed",
        "/embed_all",
        "/embed_sparse",
        "/embeddings",
        "/fill-mask",
        "/predict",
        "/rerank",
        "/similarity",
        "/token-classification",
        "/tokenize",
        "/v1/embeddings",
    ]
    assert routes["/embed"][0] is EmbedRequest and routes["/v1/embeddings"][0] is OpenAIEmbeddingRequest


class StubService:
    """Answers /embed and the OpenAI route with fixed vectors on the next turn of the loop; or raises."""

    served_name = "stub"
    kind = "embedding"
    defaults = EmbedOptions()

    def __init__(self) -> None:
        self.fault: Exception | None = None
        self.calls = 0
        self.urgencies: list[int] = []  # the urgency each call ran at, as the engine would read it
        self.embeddings = StubEmbeddings(self)

    async def answer(self, inputs: Any) -> np.ndarray:
        self.calls += 1
        self.urgencies.append(URGENCY.get())
        await asyncio.sleep(0)
        if self.fault is not None:
            raise self.fault
        n = 1 if isinstance(inputs, str) else len(inputs)
        return np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 7


class StubEmbeddings:
    """The embedding task's two calls the data path makes."""

    def __init__(self, service: StubService) -> None:
        self.service = service

    async def embed(self, inputs: Any, options: Any) -> Answer[Any]:
        return Answer(await self.service.answer(inputs), Timings(0.5, 0.25, 1.0, 2.0))

    async def openai(self, inputs: Any, dimensions: int | None) -> Answer[Any]:
        return Answer((await self.service.answer(inputs), 3), Timings(0.5, 0.25, 1.0, 2.0))


def stub_app(**settings: Any) -> tuple[FastAPI, StubService]:
    app = create_app(Settings(model="unused", warmup=False, cache_bytes=0, max_body_bytes=LIMIT, **settings))
    service = StubService()
    app.state.service = service
    return app, service


@dataclass
class Answered:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    pulled: int  # body messages the app read

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    app: ASGIApp,
    path: str,
    chunks: list[bytes],
    headers: list[tuple[bytes, bytes]],
    disconnect_after: int | None = None,
    owner: FastAPI | None = None,
) -> Answered:
    """One POST as uvicorn serves it: the body's chunks, then nothing until the response is over (or
    the disconnect, after ``disconnect_after`` chunks). ``owner``: the FastAPI app ``app`` is part of
    (which FastAPI itself puts in the scope)."""
    sent: list[Message] = []
    pulled = 0

    async def main() -> None:
        done = asyncio.Event()

        async def receive() -> Message:
            nonlocal pulled
            if disconnect_after is not None and pulled >= disconnect_after:
                return {"type": "http.disconnect"}
            if pulled < len(chunks):
                pulled += 1
                return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                done.set()

        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
        }
        if owner is not None:
            scope["app"] = owner
        await app(scope, receive, send)

    asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answered(start["status"], dict(start["headers"]), body, pulled)


def both(
    app: FastAPI, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[Answered, Answered]:
    """The same request through the data path (the app as uvicorn calls it) and through the stack and
    FastAPI behind it."""
    data_path = app.middleware_stack
    assert isinstance(data_path, DataPath)
    sized = [*headers, (b"content-length", str(len(body)).encode())]
    return call(app, path, [body], sized), call(data_path.app, path, [body], sized, owner=app)


DEEP = b"[" * 600 + b"]" * 600
# (name, path, body, headers): each read the same both ways, by the data path and by FastAPI. Bodies where
# orjson and json.loads disagree are here on purpose: the stdlib's reading must win.
SAME = [
    ("valid", "/embed", b'{"inputs": ["a", "b"]}', JSON),
    ("valid, OpenAI", "/v1/embeddings", b'{"input": "a"}', JSON),
    ("valid, base64", "/embed", b'{"inputs": "a", "encoding": "base64"}', JSON),
    ("valid, int8", "/embed", b'{"inputs": "a", "encoding": "int8"}', JSON),
    (
        "charset parameter",
        "/embed",
        b'{"inputs": "a"}',
        [(b"content-type", b"application/json; charset=utf-8")],
    ),
    ("+json type", "/embed", b'{"inputs": "a"}', [(b"content-type", b"application/vnd.api+json")]),
    ("upper-case type", "/embed", b'{"inputs": "a"}', [(b"content-type", b"Application/JSON")]),
    ("UTF-8 BOM", "/embed", b'\xef\xbb\xbf{"inputs": "a"}', JSON),
    ("UTF-16", "/embed", '{"inputs": "a"}'.encode("utf-16"), JSON),
    ("duplicate keys", "/embed", b'{"inputs": 1, "inputs": "a"}', JSON),
    ("shallow-enough nesting in an unknown field", "/embed", b'{"inputs": "a", "x": ' + DEEP + b"}", JSON),
    ("invalid JSON", "/embed", b'{"inputs": "a",', JSON),
    ("trailing comma", "/embed", b'{"inputs": ["a",]}', JSON),
    ("empty body", "/embed", b"", JSON),
    ("null", "/embed", b"null", JSON),
    ("an array", "/embed", b'["a"]', JSON),
    ("wrong content type", "/embed", b'{"inputs": "a"}', [(b"content-type", b"text/plain")]),
    ("no content type", "/embed", b'{"inputs": "a"}', []),
    ("not UTF-8", "/embed", b'{"inputs": "\xff\xfe"}', JSON),
    ("lone surrogate", "/embed", b'{"inputs": "\\ud800"}', JSON),
    ("lone surrogate, OpenAI", "/v1/embeddings", b'{"input": ["a", "\\udfff"]}', JSON),
    ("NaN", "/embed", b'{"inputs": "a", "layer_weights": [NaN]}', JSON),
    ("Infinity", "/embed", b'{"inputs": "a", "layers": [Infinity]}', JSON),
    ("1e400", "/embed", b'{"inputs": "a", "layers": [1e400]}', JSON),
    ("integer past 64 bits", "/embed", b'{"inputs": "a", "layers": [100000000000000000000000000000]}', JSON),
    ("token id past 64 bits", "/v1/embeddings", b'{"input": [[101, 100000000000000000000000000000]]}', JSON),
    ("integer of 5000 digits", "/embed", b'{"inputs": "a", "layers": [' + b"9" * 5000 + b"]}", JSON),
    ("a number where text belongs", "/embed", b'{"inputs": 3}', JSON),
    ("unknown encoding", "/embed", b'{"inputs": "a", "encoding": "fp16"}', JSON),
    ("missing inputs", "/embed", b"{}", JSON),
]


@pytest.mark.parametrize(("name", "path", "body", "headers"), SAME, ids=[row[0] for row in SAME])
def test_the_data_path_answers_as_fastapi_does(
    name: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    app, _ = stub_app()
    fast, slow = both(app, path, body, headers)
    assert (fast.status, fast.headers, fast.body) == (slow.status, slow.headers, slow.body), fast.body[:300]


@pytest.mark.parametrize(
    "body",
    [b"[" * 50_000, b'{"inputs": "a", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"],
    ids=["unterminated", "near the stdlib's limit, in an unknown field"],
)
def test_a_body_nested_too_deep_for_the_stdlib_is_refused_as_too_deep(body: bytes) -> None:
    # orjson reads 1000 levels, json.loads does not: its answer stands. (FastAPI words this one as an
    # unreadable body; the data path says what is wrong. Both 400, malformed.)
    app, service = stub_app()
    answered = call(app, "/embed", [body], JSON)
    assert answered.status == 400 and "nests" in answered.json()["error"]
    assert answered.json()["error_type"] == "malformed"
    assert service.calls == 0


# (name, API keys, draining, headers, body, status): a gate's refusal, the same both ways (both run the
# one chain of app.api.http.gates).
GATE_FAILURES = [
    ("draining", None, True, JSON, b'{"inputs": "a"}', 503),
    ("draining, before the key", "k", True, JSON, b'{"inputs": "a"}', 503),
    ("no key", "k", False, JSON, b'{"inputs": "a"}', 401),
    ("unknown key", "k", False, [*JSON, (b"authorization", b"Bearer nope")], b'{"inputs": "a"}', 401),
    ("over the limit", None, False, JSON, b'{"inputs": "' + b"a" * LIMIT + b'"}', 413),
    (
        "over the limit, with a key",
        "k",
        False,
        [*JSON, (b"authorization", b"Bearer k")],
        b"x" * (LIMIT + 1),
        413,
    ),
]


@pytest.mark.parametrize(
    ("name", "keys", "draining", "headers", "body", "status"),
    GATE_FAILURES,
    ids=[r[0] for r in GATE_FAILURES],
)
def test_a_gate_refuses_the_same_on_the_data_path_as_on_the_middleware(
    name: str, keys: str | None, draining: bool, headers: list[tuple[bytes, bytes]], body: bytes, status: int
) -> None:
    app, service = stub_app(api_keys=SecretStr(keys) if keys else None)
    if draining:
        app.state.drain.begin()
    fast, slow = both(app, "/embed", body, headers)
    assert fast.status == status
    assert (fast.status, fast.headers, fast.body) == (slow.status, slow.headers, slow.body), fast.body[:300]
    assert service.calls == 0
    metrics = app.state.metrics
    assert metrics.requests.labels("/embed", str(status), "http", "3")._value.get() == 2  # once each way


def test_errors_carry_the_same_headers_both_ways() -> None:
    app, service = stub_app(api_keys=SecretStr("k"))
    fast, slow = both(app, "/embed", b'{"inputs": "a"}', JSON)
    assert fast.status == slow.status == 401
    assert fast.headers == slow.headers and fast.headers[b"www-authenticate"] == b"Bearer"
    assert fast.body == slow.body
    keyed = [*JSON, (b"authorization", b"Bearer k")]
    fast, slow = both(app, "/embed", b'{"inputs": "a"}', keyed)
    assert fast.status == slow.status == 200 and fast.headers == slow.headers
    assert service.calls == 2


def test_a_streamed_body_over_the_limit_is_cut_off_with_413() -> None:
    app, service = stub_app()
    chunks = [b'{"inputs": "' + b"a" * 9990] + [b"a" * 10_000] * 9
    answered = call(app, "/embed", chunks, JSON)
    assert answered.status == 413 and answered.json()["error_type"] == "payload_too_large"
    assert answered.headers[b"connection"] == b"close"
    assert answered.pulled == 7  # stopped at the chunk that crossed 64 KiB, not the 10th
    assert service.calls == 0


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    app, _ = stub_app()
    answered = call(app, "/embed", [b"{}"], [*JSON, (b"content-length", str(LIMIT + 1).encode())])
    assert answered.status == 413 and answered.pulled == 0
    assert answered.headers[b"connection"] == b"close"


def test_a_streamed_body_within_the_limit_is_read_whole() -> None:
    app, _ = stub_app()
    answered = call(app, "/embed", [b'{"inputs": ', b'["a", ', b'"b"]}'], JSON)
    assert answered.status == 200 and len(answered.json()) == 2


def test_a_client_that_leaves_mid_body_gets_499_and_is_counted() -> None:
    app, service = stub_app()
    answered = call(app, "/embed", [b'{"inputs": ', b'"a"}'], JSON, disconnect_after=1)
    assert answered.status == 499 and answered.json()["error_type"] == "client_closed"
    assert service.calls == 0
    assert app.state.metrics.failures.labels("client_closed")._value.get() == 1


def test_a_server_fault_is_logged_and_answered_500_with_its_error_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, service = stub_app()
    service.fault = RuntimeError("boom")
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        answered = call(app, "/embed", [b'{"inputs": "a"}'], JSON)
    assert answered.status == 500
    error_id = answered.headers[b"x-error-id"].decode()
    assert answered.json() == {
        "error": f"{FAULT_MESSAGE} {error_id}",
        "error_type": "internal",
        "error_id": error_id,
    }
    assert "RuntimeError" not in answered.body.decode() and "boom" not in answered.body.decode()
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert "POST /embed: RuntimeError: boom" in record.getMessage() and record.exc_info is not None
    metrics = app.state.metrics
    assert metrics.requests.labels("/embed", "500", "http", "3")._value.get() == 1
    assert metrics.failures.labels("internal")._value.get() == 1


def test_draining_refuses_new_work_and_closes_the_connection() -> None:
    app, service = stub_app()
    app.state.drain.begin()
    answered = call(app, "/embed", [b'{"inputs": "a"}'], JSON)
    assert answered.status == 503 and answered.headers[b"connection"] == b"close"
    assert "shutting down" in answered.json()["error"]
    assert service.calls == 0


def test_a_request_answered_after_the_signal_closes_its_connection() -> None:
    app, service = stub_app()
    drain = app.state.drain

    async def embed_then_drain(inputs: Any, options: Any) -> Answer[Any]:
        drain.begin()  # the signal comes while the request runs
        return Answer(np.ones((1, 4), np.float32), Timings())

    service.embeddings.embed = embed_then_drain  # type: ignore[method-assign]
    answered = call(app, "/embed", [b'{"inputs": "a"}'], JSON)
    assert answered.status == 200 and answered.headers[b"connection"] == b"close"
    assert orjson.loads(answered.body) == [[1.0] * 4]


def test_before_the_model_is_loaded_data_routes_answer_503() -> None:
    app, _ = stub_app()
    del app.state.service
    answered = call(app, "/embed", [b'{"inputs": "a"}'], JSON)
    assert answered.status == 503 and answered.json()["error"] == "the model is still loading"


def test_requests_are_counted_by_route_and_status() -> None:
    app, _ = stub_app()
    call(app, "/embed", [b'{"inputs": "a"}'], JSON)
    call(app, "/embed", [b'{"inputs": 3}'], JSON)
    metrics = app.state.metrics
    assert metrics.requests.labels("/embed", "200", "http", "3")._value.get() == 1
    assert metrics.requests.labels("/embed", "422", "http", "3")._value.get() == 1
    assert metrics.failures.labels("validation")._value.get() == 1
    assert metrics.request_duration.labels("/embed", "http", "3")._sum.get() > 0


@pytest.mark.parametrize(
    ("keys", "headers", "expected"),
    [
        (None, [], 3),
        (None, [(b"priority", b"u=6")], 6),
        (None, [(b"priority", b"i"), (b"priority", b"u=1")], 1),  # two lines, one field
        (None, [(b"priority", b"U=1")], 3),  # not a Dictionary: ignored whole
        ("bulk:u=7,live", [(b"authorization", b"Bearer bulk")], 7),
        ("bulk:u=7,live", [(b"authorization", b"Bearer bulk"), (b"priority", b"u=2")], 2),
        ("bulk:u=7,live", [(b"authorization", b"Bearer bulk"), (b"priority", b"u=9")], 7),
        ("bulk:u=7,live", [(b"authorization", b"Bearer live")], 3),
    ],
)
def test_the_urgency_reaches_the_engine_and_the_counters_both_ways(
    keys: str | None, headers: list[tuple[bytes, bytes]], expected: int
) -> None:
    app, service = stub_app(api_keys=SecretStr(keys) if keys else None)
    fast, stack = both(app, "/embed", b'{"inputs": "a"}', [*JSON, *headers])
    assert fast.status == stack.status == 200
    assert service.urgencies == [expected, expected]
    counted = app.state.metrics.requests.labels("/embed", "200", "http", str(expected))._value.get()
    assert counted == 2


def test_draining_reads_the_rest_of_a_small_body_before_the_503_that_closes() -> None:
    # A socket closed with unread bytes resets the connection, and a client may lose the 503 to the reset.
    app, _ = stub_app()
    app.state.drain.begin()
    data_path = app.middleware_stack
    assert isinstance(data_path, DataPath)
    chunks = [b'{"inputs": ', b'"a"', b"}"]
    for answered in (
        call(app, "/embed", chunks, JSON),
        call(data_path.app, "/embed", chunks, JSON, owner=app),
    ):
        assert answered.status == 503 and answered.headers[b"connection"] == b"close"
        assert answered.pulled == len(chunks)


def test_draining_leaves_unread_a_body_held_back_for_100_continue_or_over_the_limit() -> None:
    app, _ = stub_app()
    app.state.drain.begin()
    held_back = call(app, "/embed", [b'{"inputs": "a"}'], [*JSON, (b"expect", b"100-continue")])
    assert held_back.status == 503 and held_back.pulled == 0
    big = [b"x" * (LIMIT // 2 + 1)] * 6
    over = call(app, "/embed", big, JSON)
    assert over.status == 503 and over.pulled == 2  # two chunks are past the limit: no more read


def sent_bodies(body: bytes) -> list[Message]:
    messages: list[Message] = []

    async def send(message: Message) -> None:
        messages.append(message)

    asyncio.run(send_body(send, body))
    return messages


def test_a_large_body_goes_out_in_pieces_the_server_drains_between() -> None:
    body = bytes(range(256)) * (BODY_PIECE // 128 + 3)  # two pieces and a part
    messages = sent_bodies(body)
    assert [len(m["body"]) for m in messages] == [BODY_PIECE, BODY_PIECE, len(body) - 2 * BODY_PIECE]
    assert [m["more_body"] for m in messages] == [True, True, False]
    assert b"".join(m["body"] for m in messages) == body


def test_a_small_body_is_one_message() -> None:
    assert sent_bodies(b"[1]") == [{"type": "http.response.body", "body": b"[1]"}]
