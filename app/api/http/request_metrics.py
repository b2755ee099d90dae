"""Every HTTP request counted by route, status and urgency, timed, and its failure counted by error type.

:func:`count` is called once per request by the HTTP gates (:mod:`app.api.http.gates`), after everything
else, for the data path and every other route alike: so 503s while draining, 401s and 413s are counted
too. The route label is the route's path, or :data:`UNMATCHED` for paths the app does not serve (a
scanner must not be able to grow the label set). The failure reason is the ``error_type`` the error path
left in the scope; an exception that escapes every handler is a server fault, :data:`INTERNAL`. The
urgency is the one the request was served at (:data:`app.engine.priority.URGENCY`, set by the gates); the
model, the one chosen for it (:data:`app.telemetry.context.CURRENT_MODEL`; a label with several models).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import Scope

from app.api.errors import ERROR_TABLE, SCOPE_ERROR_TYPE
from app.engine.priority import URGENCY
from app.errors import InternalError
from app.telemetry.context import CURRENT_MODEL
from app.telemetry.metrics import Metrics
from app.telemetry.observe import SCOPE_INPUTS, Observer

UNMATCHED = "unmatched"
INTERNAL = ERROR_TABLE[InternalError].error_type


def count(
    metrics: Metrics,
    observer: Observer | None,
    route: str,
    status: int,
    started: float,
    scope: Scope,
    span: Any,
) -> None:
    """Count the request of ``scope``, answered ``status``, begun at ``started`` (``time.perf_counter()``).

    Args:
        observer: traces and JSON log lines; None when both are off.
        span: what ``observer.begin`` gave for the request (None without an observer).
    """
    model = CURRENT_MODEL.get()
    metrics.request_done(route, status, time.perf_counter() - started, "http", URGENCY.get(), model)
    reason = scope.get(SCOPE_ERROR_TYPE)
    if reason is not None:
        metrics.failure(reason)
    if observer is not None:
        observer.end(span, "http", route, status, scope.get(SCOPE_INPUTS, 0), reason, model)
