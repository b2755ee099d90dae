"""app.telemetry.tracing against real OTLP receivers on loopback (gRPC and HTTP), and against a closed port."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from app.telemetry.otel_config import from_environment
from app.telemetry.timings import Timings
from app.telemetry.tracing import STAGES, Tracing
from tests.otlp_receiver import GrpcReceiver, HttpReceiver, ReceivedSpan, Receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
MS = 1_000_000
SHUTDOWN_DEADLINE_S = 30.0
PROTOCOLS = {"grpc": GrpcReceiver, "http/protobuf": HttpReceiver}


@pytest.fixture(params=list(PROTOCOLS))
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    with PROTOCOLS[request.param]() as running:
        yield running


def env_for(receiver: Receiver, **more: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,
        **more,
    }


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


def test_request_span_continues_the_incoming_trace_with_a_child_per_stage(receiver: Receiver) -> None:
    tracing = from_environment(env_for(receiver, OTEL_SERVICE_NAME="zhembed-test"), schedule_delay_ms=50)
    assert tracing.enabled
    start = time.time_ns()
    end = start + 20 * MS
    timings = Timings(queue_ms=3.0, tokenization_ms=2.0, inference_ms=5.0, total_ms=19.0)
    span = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, start)
    assert span is not None
    assert tracing.trace_id(span) == TRACE_ID
    tracing.end_request(span, end, 200, timings, attributes={"zhembed.cache.hits": 1, "zhembed.inputs": 3})
    tracing.shutdown()
    spans = receiver.wait_for(1 + len(STAGES))

    (request,) = by_name(spans, "POST /embed")
    assert request.trace_id == TRACE_ID
    assert request.parent_span_id == PARENT_ID
    assert request.span.kind == Span.SPAN_KIND_SERVER
    assert (request.span.start_time_unix_nano, request.span.end_time_unix_nano) == (start, end)
    assert request.attributes == {
        "zhembed.protocol": "http",
        "http.route": "/embed",
        "http.response.status_code": 200,
        "zhembed.cache.hits": 1,
        "zhembed.inputs": 3,
    }
    assert request.resource["service.name"] == "zhembed-test"
    assert tracing.traceparent(span) == f"00-{TRACE_ID}-{request.span_id}-01"

    children = {child.name: child for child in spans if child.parent_span_id == request.span_id}
    assert set(children) == set(STAGES)
    assert len(spans) == 1 + len(STAGES)
    at = start
    for name in STAGES:
        child = children[name].span
        assert child.trace_id.hex() == TRACE_ID
        assert child.kind == Span.SPAN_KIND_INTERNAL
        assert at <= child.start_time_unix_nano <= child.end_time_unix_nano <= end
        at = child.end_time_unix_nano

    def duration(name: str) -> int:
        child = children[name].span
        return child.end_time_unix_nano - child.start_time_unix_nano

    assert duration("admission") == duration("cache") == 0
    assert children["admission"].span.start_time_unix_nano == start
    assert duration("tokenization") == 2 * MS
    assert duration("queue") == 3 * MS
    assert duration("inference") == 5 * MS
    assert duration("post-processing") == 10 * MS
    assert children["post-processing"].span.end_time_unix_nano == end
    assert children["cache"].attributes == {"zhembed.cache.hits": 1}
    assert tracing.dropped == 0


def test_batch_span_links_the_requests_it_served(receiver: Receiver) -> None:
    tracing = from_environment(env_for(receiver), schedule_delay_ms=50)
    start = time.time_ns()
    first = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, start)
    second = tracing.start_request("Embed", "grpc", "tei.v1.Embed/Embed", None, start)
    assert first is not None and second is not None
    tracing.batch(start + MS, start + 4 * MS, size=2, tokens=17, requests=[first, second, first])
    tracing.end_request(first, start + 5 * MS, 200, Timings(1.0, 1.0, 3.0, 5.0))
    tracing.end_request(second, start + 5 * MS, 0, Timings(1.0, 1.0, 3.0, 5.0))
    tracing.shutdown()
    spans = receiver.wait_for(2 * (1 + len(STAGES)) + 1)

    (batch,) = by_name(spans, "batch")
    assert batch.span.kind == Span.SPAN_KIND_INTERNAL
    assert batch.parent_span_id == ""
    assert batch.attributes == {"zhembed.batch.size": 2, "zhembed.batch.tokens": 17}
    assert (batch.span.start_time_unix_nano, batch.span.end_time_unix_nano) == (start + MS, start + 4 * MS)
    (embed,) = by_name(spans, "POST /embed")
    (grpc_embed,) = by_name(spans, "Embed")
    links = [(link.trace_id.hex(), link.span_id.hex()) for link in batch.span.links]
    assert links == [(embed.trace_id, embed.span_id), (grpc_embed.trace_id, grpc_embed.span_id)]
    assert batch.trace_id not in {embed.trace_id, grpc_embed.trace_id}
    assert grpc_embed.parent_span_id == ""  # no traceparent: a trace of its own
    assert grpc_embed.attributes["rpc.method"] == "tei.v1.Embed/Embed"
    assert grpc_embed.attributes["rpc.grpc.status_code"] == 0
    assert first.span.get_span_context().span_id == int(embed.span_id, 16)


def test_error_sets_status_and_error_type() -> None:
    with GrpcReceiver() as receiver:
        tracing = from_environment({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint})
        start = time.time_ns()
        span = tracing.start_request("Embed", "grpc", "tei.v1.Embed/Embed", "not a traceparent", start)
        tracing.end_request(span, start + MS, "RESOURCE_EXHAUSTED", None, error_type="overloaded")
        tracing.shutdown()
        spans = receiver.wait_for(2)
    (request,) = by_name(spans, "Embed")
    assert request.parent_span_id == ""
    assert request.span.status.code == Status.STATUS_CODE_ERROR
    assert request.attributes["error.type"] == "overloaded"
    assert request.attributes["rpc.response.status_code"] == "RESOURCE_EXHAUSTED"
    assert [span.name for span in spans if span.parent_span_id == request.span_id] == ["admission"]


def test_http_traces_endpoint_is_used_as_given() -> None:
    with HttpReceiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint + "/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=search%20infra",
        }
        tracing = from_environment(env)
        tracing.batch(time.time_ns(), time.time_ns(), 1, 1, [])
        tracing.shutdown()
        (batch,) = receiver.wait_for(1)
    assert batch.resource["service.name"] == "zhembed"
    assert batch.resource["team"] == "search infra"


def test_sampler_always_off_exports_nothing(receiver: Receiver) -> None:
    tracing = from_environment(env_for(receiver, OTEL_TRACES_SAMPLER="always_off"), schedule_delay_ms=50)
    assert tracing.enabled
    start = time.time_ns()
    span = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, start)
    assert tracing.trace_id(span) == TRACE_ID  # the incoming trace id still reaches the log
    tracing.end_request(span, start + MS, 200, Timings())
    tracing.batch(start, start + MS, 1, 1, [span] if span else [])
    tracing.shutdown()
    assert receiver.wait_for(1, timeout=0.5) == []
    assert tracing.dropped == 0


def test_ratio_samplers_are_read() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    for name in ("always_on", "parentbased_always_off", "traceidratio", "parentbased_traceidratio"):
        from_environment({**env, "OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": "0.25"}).shutdown()
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
        from_environment({**env, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"})
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER"):
        from_environment({**env, "OTEL_TRACES_SAMPLER": "sometimes"})


@pytest.mark.parametrize(
    "more",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_SDK_DISABLED": "true"},
    ],
)
def test_disabled_exports_nothing(more: dict[str, str]) -> None:
    assert from_environment({}).enabled is False
    with GrpcReceiver() as receiver:
        tracing = from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **more})
        assert tracing.enabled is False
        span = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, time.time_ns())
        assert span is None
        tracing.end_request(span, time.time_ns(), 200, Timings())
        tracing.batch(0, 1, 1, 1, [])
        assert tracing.trace_id(span) is None
        tracing.shutdown()
        assert tracing.dropped == 0
        assert receiver.wait_for(1, timeout=0.3) == []


def test_disabled_does_no_work_per_request() -> None:
    tracing, timings = Tracing(), Timings()
    calls: list[str] = []  # every function entered, Python's and C's, while a request is traced

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)
        elif event == "c_call":
            calls.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(profile)
    try:
        span = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, 0)
        tracing.end_request(span, 0, 200, timings)
    finally:
        sys.setprofile(None)
    assert span is None
    assert calls == ["start_request", "end_request", "setprofile"]  # each returns at its first line


def test_bad_settings_raise_one_clear_error() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not supported"):
        from_environment({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='thrift'"):
        from_environment({**env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"})
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        from_environment({**env, "OTEL_TRACES_EXPORTER": "console"})


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_unreachable_collector_never_slows_requests_and_counts_what_it_drops(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
    }
    tracing = from_environment(env, max_queue_size=64, schedule_delay_ms=20)
    timings = Timings(queue_ms=1.0, tokenization_ms=1.0, inference_ms=1.0, total_ms=4.0)
    exporter = tracing._exporter.inner
    exported_on: list[str] = []  # the threads the OTLP exporter ran on
    export = exporter.export

    def recorded(spans: Any) -> Any:
        exported_on.append(threading.current_thread().name)
        return export(spans)

    monkeypatch.setattr(exporter, "export", recorded)
    requests = 2000
    start = time.time_ns()
    for i in range(requests):
        span = tracing.start_request("POST /embed", "http", "/embed", TRACEPARENT, start + i)
        tracing.end_request(span, start + i + 4 * MS, 200, timings)
    # 10,000 spans into a 64-span queue while the exporter retries: most are refused, none waited for.
    assert tracing.dropped > 0
    # Bounded, not timed: shutdown gives up on the collector (the OTLP exporter alone retries for a
    # minute); the deadline is for a hang, far past what the bound allows on any machine.
    closing = threading.Thread(target=tracing.shutdown, kwargs={"timeout_s": 0.5})
    closing.start()
    closing.join(SHUTDOWN_DEADLINE_S)
    assert not closing.is_alive()
    assert tracing.dropped == requests * (1 + len(STAGES))  # nothing arrived
    # Every export ran on the span processor's thread: a request never waits on the collector.
    assert exported_on and threading.current_thread().name not in exported_on


def test_batch_is_thread_safe() -> None:
    with GrpcReceiver() as receiver:
        tracing = from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}, schedule_delay_ms=50)
        span = tracing.start_request("POST /embed", "http", "/embed", None, time.time_ns())
        assert span is not None

        def batches() -> None:
            for _ in range(200):
                tracing.batch(time.time_ns(), time.time_ns(), 1, 3, [span])

        threads = [threading.Thread(target=batches) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        tracing.shutdown()
        spans = receiver.wait_for(800)
    assert len(by_name(spans, "batch")) == 800
    assert tracing.dropped == 0
