"""The request running in this task, as far as the engine and telemetry need to know it: its trace span,
timings, inputs and model.

A module of its own, importing nothing of the app's, so that the engine's work items can read it
without importing tracing (which imports the answers, which import the work items).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

# The request's trace span (an app.telemetry.tracing.RequestSpan); None when tracing is off or outside a request.
CURRENT_SPAN: ContextVar[Any] = ContextVar("zhembed_request_span", default=None)
# The Timings of the service call this request made last (set by app.tasks.answers.timed): what its trace
# span's children and its log line are made from.
CURRENT_TIMINGS: ContextVar[Any] = ContextVar("zhembed_request_timings", default=None)
# How many inputs the request being served carries (gRPC: set when its message is validated).
CURRENT_INPUTS: ContextVar[int] = ContextVar("zhembed_request_inputs", default=0)
# The name of the model serving the request, once one is chosen (a service of several models): its
# metrics' model label, its span's and log line's model. Empty before (or when it is refused before).
CURRENT_MODEL: ContextVar[str] = ContextVar("zhembed_request_model", default="")
