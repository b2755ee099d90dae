"""OpenTelemetry traces and JSON request logs of the running service, into a real OTLP receiver on
loopback (tests/otlp_receiver.py decodes what it receives; nothing is mocked).

A request over HTTP or gRPC continues the caller's W3C trace with a span of its own and a child per
stage, made from the service's timings; the batch that served it has a span linked to it; the request's
one log line carries its route, status, inputs, tokens, timings and trace id, and never its text. An
unreachable collector fails no request.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from app.telemetry.tracing import STAGES
from tests.app.api.rpc.grpc_process import start_grpc_server, stop_grpc_server
from tests.app.conftest import Running, start_server, wait_until
from tests.otlp_receiver import GrpcReceiver, HttpReceiver, ReceivedSpan, Receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
SECRET_TEXT = "这是一段不应出现在日志里的秘密文字"


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    with GrpcReceiver() if request.param == "grpc" else HttpReceiver() as r:
        yield r


def _serve(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, env: dict[str, str], **settings: Any
) -> Running:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    running, uv, thread = start_server(
        Settings(
            model=str(tiny_model_dir),
            variant="fp32",
            intra_op_threads=1,
            cache_bytes=0,
            max_wait_ms=2,
            **settings,
        )
    )

    def stop() -> None:
        uv.should_exit = True
        thread.join(timeout=30)

    running.app.state.stop = stop
    return running


def _spans(receiver: Receiver, trace_id: str, names: set[str], timeout: float = 10.0) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = receiver.spans()
        mine = {s.name for s in spans if s.trace_id == trace_id}
        if names - {"batch"} <= mine and ("batch" not in names or any(s.name == "batch" for s in spans)):
            return spans
        time.sleep(0.05)
    raise AssertionError(
        f"spans {names} of trace {trace_id} never arrived: {[s.name for s in receiver.spans()]}"
    )


def _check_request(spans: list[ReceivedSpan], route: str) -> ReceivedSpan:
    (request,) = [s for s in spans if s.trace_id == TRACE_ID and s.parent_span_id == PARENT]
    assert request.name == route and request.resource["service.name"] == "zhembed-it"
    children = sorted(
        (s for s in spans if s.parent_span_id == request.span_id), key=lambda s: s.span.start_time_unix_nano
    )
    assert [c.name for c in children] == list(STAGES)
    for child in children:
        assert request.span.start_time_unix_nano <= child.span.start_time_unix_nano
        assert child.span.end_time_unix_nano <= request.span.end_time_unix_nano
    inference = next(c for c in children if c.name == "inference")
    assert inference.span.end_time_unix_nano > inference.span.start_time_unix_nano  # it took time
    return request


def _linked_batch(receiver: Receiver, request: ReceivedSpan, timeout: float = 10.0) -> ReceivedSpan:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in receiver.spans():
            if s.name == "batch" and any(link.span_id.hex() == request.span_id for link in s.span.links):
                return s
        time.sleep(0.05)
    raise AssertionError("no batch span links to the request")


def _embed_request(text: str) -> bytes:
    """tei.v1.EmbedRequest{inputs: text} on the wire, by hand: this process imports no generated module
    (tests/app/api/rpc/grpc_process.py says why)."""
    raw = text.encode()
    return b"\x0a" + bytes([len(raw)]) + raw


def test_http_and_grpc_requests_continue_the_callers_trace(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, receiver: Receiver
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,
        "OTEL_SERVICE_NAME": "zhembed-it",
    }
    running = _serve(monkeypatch, tiny_model_dir, env)
    try:
        response = httpx.post(
            running.url + "/embed",
            json={"inputs": ["你好", "今天天气很好"]},
            headers={"traceparent": TRACEPARENT},
        )
        assert response.status_code == 200
        request = _check_request(_spans(receiver, TRACE_ID, {"/embed", *STAGES}), "/embed")
        assert request.attributes["http.route"] == "/embed"
        batch = _linked_batch(receiver, request)
        assert batch.trace_id != TRACE_ID and batch.attributes["zhembed.batch.size"] >= 1
    finally:
        running.app.state.stop()
    # gRPC, from a server process of its own exporting to the same receiver.
    server = start_grpc_server(tiny_model_dir, **env)
    try:
        other = "5bf92f3577b34da6a3ce929d0e0e4736"
        call = server.channel.unary_unary("/tei.v1.Embed/Embed")
        answer = call(_embed_request("你好"), metadata=[("traceparent", f"00-{other}-{PARENT}-01")])
        assert len(answer) > 64 * 4  # 64 floats and the metadata
        spans = _spans(receiver, other, {"/tei.v1.Embed/Embed", *STAGES})
        (rpc,) = [s for s in spans if s.trace_id == other and s.parent_span_id == PARENT]
        assert rpc.name == "/tei.v1.Embed/Embed" and rpc.attributes["rpc.system"] == "grpc"
        children = {s.name for s in spans if s.parent_span_id == rpc.span_id}
        assert children == set(STAGES)
        _linked_batch(receiver, rpc)
    finally:
        stop_grpc_server(server)


def test_an_unreachable_collector_fails_no_request(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket is closed
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    running = _serve(monkeypatch, tiny_model_dir, env)
    try:
        assert running.app.state.tracing.enabled
        with httpx.Client(base_url=running.url, timeout=10) as client:
            # Answered as ever (that no request waits on the collector is test_tracing's, by thread).
            for i in range(50):
                assert client.post("/embed", json={"inputs": f"第{i}句"}).status_code == 200
    finally:
        running.app.state.stop()


def test_one_json_line_per_request_without_its_text(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from app.telemetry.logs import JsonFormatter

    running = _serve(monkeypatch, tiny_model_dir, {}, log_format="json")
    try:
        with caplog.at_level(logging.INFO, logger="app.requests"):
            response = httpx.post(
                running.url + "/embed",
                json={"inputs": [SECRET_TEXT, "你好"]},
                headers={"authorization": "Bearer x"},
            )
            assert response.status_code == 200
            bad = httpx.post(running.url + "/embed", json={"inputs": ""})
            assert bad.status_code == 400
            # A request's line is written once its answer is out: the server's thread may write it after
            # the client has read the answer.
            wait_until(lambda: sum(r.name == "app.requests" for r in caplog.records) >= 2)
        lines = [JsonFormatter().format(r) for r in caplog.records if r.name == "app.requests"]
        assert len(lines) == 2
        import json

        ok, failed = (json.loads(line) for line in lines)
        assert ok["route"] == "/embed" and ok["status"] == 200 and ok["inputs"] == 2 and ok["tokens"] > 4
        assert ok["total_ms"] > 0 and "inference_ms" in ok and ok["protocol"] == "http"
        assert failed["status"] == 400 and failed["error_type"] == "empty"
        for line in lines:
            assert SECRET_TEXT not in line and "Bearer" not in line and "你好" not in line
    finally:
        running.app.state.stop()


@pytest.mark.parametrize(
    ("body", "count"),
    [
        ({"query": "q", "documents": ["a", {"text": "b"}, "c"]}, 3),
        ({"ids": [101, 791, 102]}, 1),
        ({"ids": [[101, 102], [101, 791, 102]]}, 2),
    ],
)
def test_the_log_line_counts_documents_and_id_lists(body: dict[str, Any], count: int) -> None:
    from app.api.http.retrieval_schemas import CohereRerankRequest, DecodeRequest
    from app.telemetry.observe import count_inputs

    model = DecodeRequest if "ids" in body else CohereRerankRequest
    assert count_inputs(model.model_validate(body)) == count
