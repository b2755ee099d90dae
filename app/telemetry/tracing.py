"""OpenTelemetry traces over OTLP: off unless the standard ``OTEL_*`` variables turn them on
(:mod:`app.telemetry.otel_config` reads them; :mod:`app.telemetry.export` bounds and counts the export).

Spans are laid out from the times a request already measured (:class:`app.tasks.answers.Timings`) and the
times the caller passes: no extra clock runs on the request path. Export happens on the SDK's batch
thread; a slow or absent collector never fails or slows a request, and what it costs is counted in
:attr:`Tracing.dropped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import (
    DEFAULT_ON,
    Sampler,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.telemetry.export import CountingExporter, CountingProcessor, Counts
from app.telemetry.timings import Timings

log = logging.getLogger(__name__)

Attributes = Mapping[str, str | int | float | bool]

STAGES = ("admission", "cache", "tokenization", "queue", "inference", "post-processing")
_PROPAGATOR = TraceContextTextMapPropagator()
_MS = 1_000_000  # nanoseconds per millisecond


class RequestSpan:
    """One request's SERVER span and what ending it needs."""

    __slots__ = ("protocol", "span", "start_ns")

    def __init__(self, span: trace.Span, protocol: str, start_ns: int) -> None:
        self.span = span
        self.protocol = protocol
        self.start_ns = start_ns


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
        self._counts = Counts()
        self._export_timeout_s = export_timeout_s
        if exporter is None:
            return
        self._exporter = CountingExporter(exporter, self._counts)
        self._processor = CountingProcessor(
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

    def batch(
        self,
        start_ns: int,
        end_ns: int,
        size: int,
        tokens: int,
        requests: Sequence[RequestSpan | None],
        model: str | None = None,
    ) -> None:
        """A ``batch`` span in its own trace, linked to the request spans it served (any thread);
        ``model``: which model of several it ran (``zhembed.model``)."""
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
                attributes={
                    "zhembed.batch.size": size,
                    "zhembed.batch.tokens": tokens,
                    **({"zhembed.model": model} if model is not None else {}),
                },
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
