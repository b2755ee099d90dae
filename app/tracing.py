"""OpenTelemetry traces over OTLP: off unless the standard ``OTEL_*`` variables turn them on.

Spans are laid out from the times a request already measured (:class:`app.answers.Timings`) and the
times the caller passes: no extra clock runs on the request path. Export happens on the SDK's batch
thread; a slow or absent collector never fails or slows a request, and what it costs is counted in
:attr:`Tracing.dropped`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.answers import Timings

log = logging.getLogger(__name__)

Attributes = Mapping[str, str | int | float | bool]

PROTOCOLS = ("grpc", "http/protobuf")
STAGES = ("admission", "cache", "tokenization", "queue", "inference", "post-processing")
_PROPAGATOR = TraceContextTextMapPropagator()
_MS = 1_000_000  # nanoseconds per millisecond
_FIXED_SAMPLERS: dict[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF,
}
_RATIO_SAMPLERS: dict[str, type[Sampler]] = {
    "traceidratio": TraceIdRatioBased,
    "parentbased_traceidratio": ParentBasedTraceIdRatio,
}


class RequestSpan:
    """One request's SERVER span and what ending it needs."""

    __slots__ = ("protocol", "span", "start_ns")

    def __init__(self, span: trace.Span, protocol: str, start_ns: int) -> None:
        self.span = span
        self.protocol = protocol
        self.start_ns = start_ns


class _Counts:
    """Span counts shared by the processor (request threads) and the exporter (the export thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted = 0  # sampled spans handed to the processor
        self.overflow = 0  # of those, pushed out of a full queue
        self.delivered = 0  # in batches the collector accepted
        self.failed = 0  # in batches whose export failed


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it delivers and what it fails; past ``deadline`` it fails at once."""

    def __init__(self, inner: SpanExporter, counts: _Counts) -> None:
        self.inner = inner
        self.counts = counts
        self.deadline: float | None = None  # time.monotonic() after which exports are given up
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        if self.deadline is None or time.monotonic() < self.deadline:
            try:
                result = self.inner.export(spans)
            except Exception:
                log.debug("span export failed", exc_info=True)
        with self.counts.lock:
            if result is SpanExportResult.SUCCESS:
                self.counts.delivered += len(spans)
            else:
                self.counts.failed += len(spans)
        return result

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.inner.shutdown()
        except Exception:
            log.debug("span exporter shutdown failed", exc_info=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _CountingProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans it is given and refusing (and counting) those that
    find its queue full.

    SDK 1.45's ``BatchProcessor.emit`` would push the oldest span out of its bounded deque, with only a
    (de-duplicated, yet costly) warning and, when the SDK's internal metrics are on, a metric. So the
    queue's length is read first and a span that finds it full is not emitted but counted; emits are
    serialised by the counts' lock, and the export thread only takes spans out, so none is lost uncounted.
    ``_queue`` is private: should a later SDK lack it, the SDK drops instead and the reconciled count of
    :attr:`Tracing.dropped` after shutdown (accepted minus delivered) still holds.
    """

    def __init__(self, exporter: _CountingExporter, counts: _Counts, **options: Any) -> None:
        super().__init__(exporter, **options)
        self._counts = counts
        queue = getattr(self._batch_processor, "_queue", None)
        self._queue: deque[Any] | None = queue if isinstance(queue, deque) and queue.maxlen else None

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        queue = self._queue
        with self._counts.lock:
            self._counts.accepted += 1
            if queue is not None and len(queue) >= (queue.maxlen or 0):
                self._counts.overflow += 1
                return
            super().on_end(span)


class Tracing:
    """Makes the service's spans; with no exporter it is disabled and every method returns at once."""

    def __init__(
        self,
        exporter: SpanExporter | None = None,
        *,
        service_name: str = "zhembed",
        resource_attributes: Attributes | None = None,
        sampler: Sampler | None = None,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_ms: float = 500.0,
        export_timeout_s: float = 2.0,
        max_links: int = 1024,
    ) -> None:
        self.enabled = exporter is not None
        self._closed = False
        self._counts = _Counts()
        self._export_timeout_s = export_timeout_s
        if exporter is None:
            return
        self._exporter = _CountingExporter(exporter, self._counts)
        self._processor = _CountingProcessor(
            self._exporter,
            self._counts,
            max_queue_size=max_queue_size,
            max_export_batch_size=min(max_export_batch_size, max_queue_size),
            schedule_delay_millis=schedule_delay_ms,
            export_timeout_millis=export_timeout_s * 1000,
        )
        self._provider = TracerProvider(
            sampler=sampler if sampler is not None else DEFAULT_ON,
            resource=Resource.create({**(resource_attributes or {}), "service.name": service_name}),
            shutdown_on_exit=False,  # the SDK's atexit shutdown waits up to 30 s; ours is bounded
            span_limits=SpanLimits(max_links=max_links),
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("zhembed")

    @property
    def dropped(self) -> int:
        """Spans that did not reach the collector: refused by a full queue or in a failed export; after
        :meth:`shutdown`, every sampled span the collector did not acknowledge (still queued ones too)."""
        counts = self._counts
        with counts.lock:
            if self._closed:
                return counts.accepted - counts.delivered
            return counts.overflow + counts.failed

    def start_request(
        self,
        name: str,
        protocol: str,
        route: str,
        traceparent: str | None,
        start_ns: int,
        attributes: Attributes | None = None,
        *,
        tracestate: str | None = None,
    ) -> RequestSpan | None:
        """A request's SERVER span from ``start_ns``, the child of an incoming W3C ``traceparent``."""
        if not self.enabled:
            return None
        try:
            context = Context()
            if traceparent:
                carrier = {"traceparent": traceparent}
                if tracestate:
                    carrier["tracestate"] = tracestate
                context = _PROPAGATOR.extract(carrier, context=Context())
            values: dict[str, str | int | float | bool] = {"zhembed.protocol": protocol}
            if protocol == "grpc":
                values["rpc.system"] = "grpc"
                values["rpc.method"] = route
            else:
                values["http.route"] = route
            if attributes:
                values.update(attributes)
            span = self._tracer.start_span(
                name, context=context, kind=SpanKind.SERVER, attributes=values, start_time=start_ns
            )
            return RequestSpan(span, protocol, start_ns)
        except Exception:
            log.debug("could not start a request span", exc_info=True)
            return None

    def end_request(
        self,
        span: RequestSpan | None,
        end_ns: int,
        status: int | str,
        timings: Timings | None,
        error_type: str | None = None,
        attributes: Attributes | None = None,
    ) -> None:
        """End the request span at ``end_ns`` with one child span per stage, laid out from ``timings``.

        The stages follow each other from the span's start: admission and cache (zero length),
        tokenization, queue, inference, then post-processing up to ``end_ns``; none runs past ``end_ns``.
        Without timings (a request refused early) only admission is recorded. ``attributes`` go on the
        request span; those whose key contains ``cache`` (e.g. ``zhembed.cache.hits``) on the cache span too.
        """
        if span is None or not self.enabled:
            return
        try:
            request = span.span
            if not request.is_recording():
                request.end(end_time=end_ns)
                return
            start = span.start_ns
            end = max(end_ns, start)
            if isinstance(status, int) and not isinstance(status, bool):
                key = "http.response.status_code" if span.protocol == "http" else "rpc.grpc.status_code"
            else:
                key = "rpc.response.status_code"
            request.set_attribute(key, status)
            if attributes:
                request.set_attributes(attributes)
            if error_type:
                request.set_attribute("error.type", error_type)
                request.set_status(StatusCode.ERROR, error_type)
            request.end(end_time=end)
            if not isinstance(request, ReadableSpan):
                return
            parent = request.get_span_context()
            if parent is None or not parent.trace_flags.sampled:
                return
            self._stage(request, parent, "admission", start, start)
            if timings is not None:
                cache = {k: v for k, v in attributes.items() if "cache" in k} if attributes else None
                self._stage(request, parent, "cache", start, start, cache)
                at = start
                for stage, ms in (
                    ("tokenization", timings.tokenization_ms),
                    ("queue", timings.queue_ms),
                    ("inference", timings.inference_ms),
                ):
                    stop = min(at + max(int(ms * _MS), 0), end)
                    self._stage(request, parent, stage, at, stop)
                    at = stop
                self._stage(request, parent, "post-processing", at, end)
        except Exception:
            log.debug("could not end a request span", exc_info=True)

    def _stage(
        self,
        request: ReadableSpan,
        parent: SpanContext,
        name: str,
        start: int,
        end: int,
        attributes: Attributes | None = None,
    ) -> None:
        """One finished child span of ``request``, handed straight to the processor.

        Built as a ReadableSpan rather than through the tracer: a child takes its parent's sampling
        decision under every supported sampler (parent-based, or fixed, or a ratio of the same trace id),
        so the tracer's sampling, locking and on_start would only cost time.
        """
        context = SpanContext(
            parent.trace_id,
            self._provider.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=parent.trace_flags,
            trace_state=parent.trace_state,
        )
        self._processor.on_end(
            ReadableSpan(
                name,
                context=context,
                parent=parent,
                resource=request.resource,
                attributes=dict(attributes) if attributes else None,
                kind=SpanKind.INTERNAL,
                start_time=start,
                end_time=end,
                instrumentation_scope=request.instrumentation_scope,
            )
        )

    def span_context(self, span: RequestSpan) -> SpanContext:
        """The request span's context (to link to it)."""
        return span.span.get_span_context()

    def batch(
        self, start_ns: int, end_ns: int, size: int, tokens: int, requests: Sequence[RequestSpan | None]
    ) -> None:
        """A ``batch`` span in its own trace, linked to the request spans it served (any thread)."""
        if not self.enabled:
            return
        try:
            seen: set[int] = set()
            links: list[Link] = []
            for request in requests:
                if request is None:
                    continue
                context = request.span.get_span_context()
                if context.is_valid and context.span_id not in seen:
                    seen.add(context.span_id)
                    links.append(Link(context))
            self._tracer.start_span(
                "batch",
                context=Context(),
                kind=SpanKind.INTERNAL,
                attributes={"zhembed.batch.size": size, "zhembed.batch.tokens": tokens},
                links=links,
                start_time=start_ns,
            ).end(end_time=max(end_ns, start_ns))
        except Exception:
            log.debug("could not record a batch span", exc_info=True)

    def traceparent(self, span: RequestSpan) -> str:
        """The request span's W3C ``traceparent`` header value."""
        context = span.span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    def trace_id(self, span: RequestSpan | None) -> str | None:
        """The request's trace id as 32 hex characters (for the JSON log), or None."""
        if span is None:
            return None
        context = span.span.get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Export what is queued for up to ``timeout_s``, then give the rest up; returns within about
        ``timeout_s`` plus the export timeout, whatever the collector does."""
        if not self.enabled or self._closed:
            return
        with self._counts.lock:
            self._closed = True
        self._exporter.deadline = time.monotonic() + timeout_s
        closing = threading.Thread(target=self._close, name="zhembed-tracing-shutdown", daemon=True)
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():  # an export is still retrying: abort it
            self._exporter.shutdown()
            closing.join(self._export_timeout_s)

    def _close(self) -> None:
        try:
            self._provider.shutdown()
        except Exception:
            log.debug("tracer provider shutdown failed", exc_info=True)


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _setting(env: Mapping[str, str], name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``, else ''."""
    return (
        env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or ""
    ).strip()


def _sampler(env: Mapping[str, str]) -> Sampler:
    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if name in _FIXED_SAMPLERS:
        return _FIXED_SAMPLERS[name]
    if name not in _RATIO_SAMPLERS:
        known = ", ".join([*_FIXED_SAMPLERS, *_RATIO_SAMPLERS])
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r} is not supported (one of: {known})")
    arg = (env.get("OTEL_TRACES_SAMPLER_ARG") or "1.0").strip()
    try:
        rate = float(arg)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
    return _RATIO_SAMPLERS[name](rate)  # type: ignore[call-arg]


def _resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``key=value`` pairs, comma separated, percent-encoded."""
    pairs = {}
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _headers(env: Mapping[str, str]) -> dict[str, str]:
    pairs = {}
    for item in _setting(env, "HEADERS").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip()).lower()] = unquote(value.strip())
    return pairs


def _exporter(env: Mapping[str, str], protocol: str, timeout_s: float) -> SpanExporter:
    traces_endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    endpoint = traces_endpoint or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    headers = _headers(env)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        insecure = _setting(env, "INSECURE")
        return GrpcExporter(
            endpoint=endpoint,
            insecure=_true(insecure) if insecure else None,
            headers=headers or None,
            timeout=timeout_s,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    if not traces_endpoint:  # the base endpoint gets the signal's path
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint, headers=headers or None, timeout=timeout_s)


def from_environment(
    env: Mapping[str, str] | None = None,
    default_service_name: str = "zhembed",
    *,
    max_queue_size: int = 2048,
    max_export_batch_size: int = 512,
    schedule_delay_ms: float = 500.0,
    export_timeout_s: float = 2.0,
) -> Tracing:
    """Tracing as the standard OpenTelemetry variables in ``env`` (default: the process's) ask.

    On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, unless
    ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``. Raises ValueError on a protocol,
    exporter or sampler it does not support.
    """
    env = os.environ if env is None else env
    if _true(env.get("OTEL_SDK_DISABLED")):
        return Tracing()
    exporters = {e.strip().lower() for e in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")} - {""}
    if "none" in exporters:
        return Tracing()
    if exporters - {"otlp"}:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER')!r} is not supported (otlp or none)"
        )
    if not (
        (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
        or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    ):
        return Tracing()
    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not (env.get(variable) or "").strip():
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = (_setting(env, "PROTOCOL") or "grpc").lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"{variable}={protocol!r} is not supported (grpc or http/protobuf)")
    sampler = _sampler(env)
    return Tracing(
        _exporter(env, protocol, export_timeout_s),
        service_name=(env.get("OTEL_SERVICE_NAME") or "").strip() or default_service_name,
        resource_attributes=_resource_attributes(env),
        sampler=sampler,
        max_queue_size=max_queue_size,
        max_export_batch_size=max_export_batch_size,
        schedule_delay_ms=schedule_delay_ms,
        export_timeout_s=export_timeout_s,
    )
