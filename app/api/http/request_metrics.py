"""Count every HTTP request by route and status, time it, and count failures by error type.

The outermost middleware, so 401s and 413s answered by the middleware below it are counted too. The
route label is the route's path, or ``unmatched`` for paths the app does not serve (a scanner must not
be able to grow the label set). The failure reason is the ``error_type`` the error path left in the
scope; an exception that escapes every handler is a server fault, ``internal``. POST on a data route
never reaches this stack: :mod:`app.api.http.fast` counts it the same way.

It also reads the request's urgency from its ``Priority`` header (:mod:`app.api.priority`) and sets it for
the engine (:data:`app.engine.priority.URGENCY`) before the layers below run; the API-key middleware
replaces it with the key's default where the header set none. The request is counted with the urgency
it was served at.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import ERROR_TABLE, SCOPE_ERROR_TYPE
from app.api.priority import SCOPE_HEADER_URGENCY, SCOPE_URGENCY, header_urgency, joined
from app.engine.priority import DEFAULT_URGENCY, URGENCY
from app.errors import InternalError
from app.telemetry.metrics import Metrics
from app.telemetry.observe import SCOPE_INPUTS, Observer, traceparent

UNMATCHED = "unmatched"


class RequestMetricsMiddleware:
    def __init__(
        self, app: ASGIApp, metrics: Metrics, routes: frozenset[str], observer: Observer | None = None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        # Traces and JSON log lines: None when both are off (nothing per request then).
        self.observer = observer if observer is not None and observer.active else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        observer = self.observer
        path = scope.get("path", "")
        route = path if path in self.routes else UNMATCHED
        field = joined([v for k, v in scope.get("headers", ()) if k == b"priority"])
        from_header = header_urgency(field) if field is not None else None
        scope[SCOPE_HEADER_URGENCY] = from_header
        scope[SCOPE_URGENCY] = urgency = from_header if from_header is not None else DEFAULT_URGENCY
        URGENCY.set(urgency)
        span = observer.begin("http", route, traceparent(scope)) if observer is not None else None

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            scope.setdefault(SCOPE_ERROR_TYPE, ERROR_TABLE[InternalError].error_type)
            raise
        finally:
            self.metrics.request_done(
                route, status, time.perf_counter() - started, "http", scope.get(SCOPE_URGENCY, urgency)
            )
            reason = scope.get(SCOPE_ERROR_TYPE)
            if reason is not None:
                self.metrics.failure(reason)
            if observer is not None:
                observer.end(span, "http", route, status, scope.get(SCOPE_INPUTS, 0), reason)
