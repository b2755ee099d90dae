"""Real OTLP trace receivers on loopback for the tests: gRPC (TraceService/Export) and HTTP (POST /v1/traces).

Each keeps the decoded ``ExportTraceServiceRequest``s; :meth:`spans` flattens them into
:class:`ReceivedSpan`s carrying their resource's attributes.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as Python."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def attributes_of(pairs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue``s as a dict."""
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass
class ReceivedSpan:
    """One decoded span with its resource's and its own attributes as dicts."""

    span: Span
    resource: dict[str, Any]
    scope: str

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_of(self.span.attributes)

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()


class Receiver:
    """What both receivers share: the stored requests, their spans, and waiting for them."""

    endpoint: str
    protocol: str  # the OTEL_EXPORTER_OTLP_PROTOCOL value that reaches it

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._changed = threading.Condition()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def store(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._changed:
            self.requests.append(request)
            self._changed.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        with self._changed:
            requests = list(self.requests)
        return [
            ReceivedSpan(span, attributes_of(resource_spans.resource.attributes), scope_spans.scope.name)
            for request in requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    def count(self) -> int:
        """How many spans arrived so far."""
        with self._changed:
            return self._count()

    def wait_for(self, n: int, timeout: float = 5.0) -> list[ReceivedSpan]:
        """The spans once at least ``n`` arrived (or whatever arrived when ``timeout`` ran out)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._count() < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        return self.spans()

    def _count(self) -> int:
        return sum(
            len(scope.spans)
            for request in self.requests
            for rs in request.resource_spans
            for scope in rs.scope_spans
        )


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.receiver.store(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcReceiver(Receiver):
    """An OTLP/gRPC TraceService on a free 127.0.0.1 port; ``endpoint`` is its http:// URL."""

    protocol = "grpc"

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404 if self.path != "/v1/traces" else 415)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.receiver.store(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    receiver: Receiver


class HttpReceiver(Receiver):
    """An OTLP/HTTP (protobuf) receiver on a free 127.0.0.1 port; ``endpoint`` is its base URL."""

    protocol = "http/protobuf"

    def start(self) -> None:
        self._server = _HttpServer(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="otlp-http", daemon=True
        )
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
