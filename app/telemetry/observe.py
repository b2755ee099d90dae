"""Each request's trace span and JSON log line, for HTTP and gRPC alike; both off by default, then free.

:meth:`Observer.begin` starts the request's span (continuing an incoming W3C ``traceparent``) and
leaves it in :data:`app.telemetry.context.CURRENT_SPAN`, where the jobs the request creates pick it up, so that the inference
thread can link each batch's span to the requests it served. :meth:`Observer.end` ends it, with child
spans laid out from the :class:`~app.tasks.answers.Timings` the service measured anyway (no clocks of its
own on the hot path), and writes the request's one JSON log line (``ZHEMBED_LOG_FORMAT=json``): route,
status, model, inputs, tokens, timings and the trace id, never a text, a header or a key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any

from app.telemetry.context import CURRENT_SPAN, CURRENT_TIMINGS
from app.telemetry.logs import request_line
from app.telemetry.timings import Timings
from app.telemetry.tracing import RequestSpan, Tracing

log = logging.getLogger("app.requests")

# Where a route leaves how many inputs its request carried, for the log line (the scope's key).
SCOPE_INPUTS = "zhembed.inputs"


def traceparent(scope: MutableMapping[str, Any]) -> str | None:
    """The request's W3C ``traceparent`` header, if it sent one (ASGI scope)."""
    for name, value in scope["headers"]:
        if name == b"traceparent":
            return str(value.decode("latin-1"))
    return None


class Observer:
    def __init__(self, tracing: Tracing, json_lines: bool) -> None:
        self.tracing = tracing
        self.json_lines = json_lines
        # Whether there is anything to do per request at all: when False, callers skip both calls.
        self.active = tracing.enabled or json_lines

    def begin(self, protocol: str, route: str, traceparent: str | None) -> RequestSpan | None:
        """Start the request's span (None with tracing off); call only when :attr:`active`."""
        CURRENT_TIMINGS.set(None)
        if not self.tracing.enabled:
            return None
        span = self.tracing.start_request(route, protocol, route, traceparent, time.time_ns())
        CURRENT_SPAN.set(span)
        return span

    def end(
        self,
        span: RequestSpan | None,
        protocol: str,
        route: str,
        status: int | str,
        inputs: int,
        error_type: str | None,
        model: str = "",
    ) -> None:
        """End the span and write the log line, with the timings the service left for this request and the
        model that served it (empty: none was chosen)."""
        timings: Timings | None = CURRENT_TIMINGS.get()
        if span is not None:
            attributes = {"zhembed.model": model} if model else None
            self.tracing.end_request(span, time.time_ns(), status, timings, error_type, attributes)
        if self.json_lines:
            request_line(
                log,
                protocol=protocol,
                route=route,
                status=status,
                inputs=inputs,
                tokens=timings.tokens if timings is not None else 0,
                timings=timings,
                trace_id=self.tracing.trace_id(span),
                error_type=error_type,
            )


def count_inputs(body: Any) -> int:
    """How many inputs a request body carries (texts, pairs, a query's texts or documents, lists of ids
    to decode), for the log line."""
    for name in ("inputs", "input", "texts", "pairs", "documents", "ids"):
        value = getattr(body, name, None)
        if value is None:
            continue
        if isinstance(value, str) or (name == "ids" and value and not isinstance(value[0], list)):
            return 1
        if isinstance(value, list):
            return len(value)
        sentences = getattr(value, "sentences", None)
        if isinstance(sentences, list):
            return 1 + len(sentences)
        return 1
    return 0
