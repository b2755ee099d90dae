"""The gates every HTTP request passes, one chain for the data path and for every other route.

In this order, each a plain function in its own module:

1. draining (:mod:`app.api.drain`): while draining, :func:`~app.api.drain.refuse` answers 503 with
   ``connection: close`` (``/health`` and ``/metrics`` still answer);
2. the API key (:meth:`app.api.auth.ApiKeys.check`), before the body is read: 401;
3. the request's urgency (:func:`app.api.urgency.urgency`): its ``Priority`` header, else its key's
   default, else 3, read once into :data:`app.engine.priority.URGENCY`, the one value the engine and the
   counters read;
4. the body limit (:mod:`app.api.http.body_limit`): a declared ``Content-Length`` over it is 413 unread, a
   streamed body is cut off at it (413);
5. the request counted (:func:`app.api.http.request_metrics.count`), whatever happened above.

Steps 2 to 4 take one pass over the request's headers (:meth:`Gates.admit`). Every answer sent while
draining or retiring carries ``connection: close``, an error answered here too.

POST on a data route runs the chain in :class:`app.api.http.fast.DataPath`, in front of everything; every
other request in :class:`GateMiddleware`, in front of FastAPI. gRPC calls run the gates that apply to them
(draining, the key, the urgency: :mod:`app.api.rpc.calls`).
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.auth import ApiKeys
from app.api.drain import CLOSE, LIVE_PATHS, Drain, refuse, with_close
from app.api.errors import SCOPE_ERROR_TYPE, send_error
from app.api.http.body_limit import declared_length, limited, too_large
from app.api.http.request_metrics import INTERNAL, UNMATCHED, count
from app.api.urgency import urgency
from app.engine.priority import URGENCY
from app.errors import PayloadTooLarge, ServiceError, Unauthorized
from app.telemetry.metrics import Metrics
from app.telemetry.observe import Observer, traceparent


class Gates:
    """What the gates need, built once per app and shared by its two entry points.

    Args:
        keys: the API keys; None when none are configured.
        observer: traces and JSON log lines; kept only when one of them is on (nothing per request else).
    """

    def __init__(
        self,
        *,
        metrics: Metrics,
        drain: Drain,
        keys: ApiKeys | None,
        max_body_bytes: int,
        observer: Observer | None = None,
    ) -> None:
        self.metrics = metrics
        self.drain = drain
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.observer = observer if observer is not None and observer.active else None

    def admit(self, scope: Scope, keys: ApiKeys | None) -> bytes | None:
        """Pass the request through the gates before its body (after draining, which the caller checks
        first: its refusal reads the body): the API key, the urgency, the declared body size. Sets the
        request's urgency for the engine and returns its ``Content-Type`` (the data path reads the body by
        it), in the same pass over the headers.

        Args:
            keys: the keys to check the request against; None where it needs none (no keys configured,
                or a route open without one).

        Raises:
            Unauthorized: no valid key.
            PayloadTooLarge: a declared ``Content-Length`` over the limit.
        """
        content_type = authorization = priority = None
        declared_over = False
        for name, value in scope["headers"]:
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"content-length":
                declared_over = declared_over or declared_length(value) > self.max_body_bytes
            elif name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"priority":  # several lines are one field (RFC 9110 §5.3)
                priority = value if priority is None else priority + b", " + value
        key_urgency = None
        if keys is not None:
            problem, key_urgency = keys.check(authorization)
            if problem is not None:
                raise Unauthorized(problem)
        # Set only when the request says something: a request's task starts at the default (3).
        if priority is not None or key_urgency is not None:
            URGENCY.set(urgency(priority, key_urgency))
        if declared_over:
            raise too_large(self.max_body_bytes)
        return content_type

    async def answer_error(self, exc: ServiceError, scope: Scope, send: Send) -> int:
        """Answer ``exc`` from the table; with ``connection: close`` after a 413 (the rest of the body is
        unread: the connection cannot be reused) and while draining or retiring. Returns the status."""
        close = isinstance(exc, PayloadTooLarge) or self.drain.closing
        return await send_error(exc, scope, send, [CLOSE] if close else ())


class GateMiddleware:
    """Every request but POST on a data route: the gates, then ``app`` (FastAPI).

    Args:
        routes: the app's route paths (others are counted as ``unmatched``).
        open_paths: the routes that need no API key.
    """

    def __init__(
        self, app: ASGIApp, gates: Gates, routes: frozenset[str], open_paths: frozenset[str]
    ) -> None:
        self.app = app
        self.gates = gates
        self.routes = routes
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gates = self.gates
        drain = gates.drain
        path = scope.get("path", "")
        route = path if path in self.routes else UNMATCHED
        started = time.perf_counter()
        status = 500
        observer = gates.observer
        span = observer.begin("http", route, traceparent(scope)) if observer is not None else None

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if drain.closing:  # accepted before the signal (or retirement), answered after: it closes
                    message = {**message, "headers": with_close(list(message.get("headers", [])))}
            await send(message)

        try:
            if drain.draining and path not in LIVE_PATHS:
                status = await refuse(scope, receive, send, gates.max_body_bytes)
                return
            try:
                gates.admit(scope, None if path in self.open_paths else gates.keys)
            except ServiceError as exc:
                status = await gates.answer_error(exc, scope, send)
                return
            await limited(self.app, scope, receive, answer, gates.max_body_bytes)
        except Exception:
            scope.setdefault(SCOPE_ERROR_TYPE, INTERNAL)
            raise
        finally:
            count(gates.metrics, observer, route, status, started, scope, span)
