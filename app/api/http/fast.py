"""The data routes' HTTP path: a POST to a data route is served by one ASGI function, in front of all else.

The FastAPI routes in :mod:`app.api.http.routes` and :mod:`app.api.http.openai_routes` declare the API (OpenAPI,
docs) and, with the middleware of :mod:`app.serving.factory`, serve every other request. For POST on a data route
:class:`DataPath`, the outermost ASGI callable, does in one function what that stack does, in the same
order, and calls the same route function:

1. draining (:mod:`app.api.drain`): 503 with ``connection: close``;
2. API keys (:mod:`app.api.auth`), before the body is read: 401; the request's urgency from its
   ``Priority`` header or its key's default (:mod:`app.api.priority`), set for the engine
   (:data:`app.engine.priority.URGENCY`);
3. a declared ``Content-Length`` over the limit (:mod:`app.api.http.body_limit`): 413, unread; a streamed
   body is counted as it comes and cut off at the limit: 413;
4. the body read, parsed and validated exactly as FastAPI does it: JSON only under a JSON
   ``Content-Type``, the same errors for a body that is not valid JSON (position and reason), nests too
   deep, is not UTF-8 (400, ``malformed``), is missing or is not an object, and for fields that do not
   validate (422; the schema models' ``model_validate``, strict), all through
   :func:`app.api.errors.validation_error`;
5. the route function, with the service; typed errors through the one error table, anything else a
   logged server fault (500); a client that leaves gets its work cancelled (499, ``client_closed``);
6. the answer sent as two ASGI messages (the route's prebuilt byte-pair headers), ``connection:
   close`` added while draining or retiring; the request counted by route, status and urgency, its failure by reason, as
   :mod:`app.api.http.request_metrics` counts every other request.

Each layer of the stack costs a coroutine, a closure around ``send`` and a dict or two per request, and
FastAPI's own (routing, the dependency solver, its body parsing) more: issue 13 took the latter off, this
module the rest (issue 19; ``python -m loadtest.http_path`` measures it).

JSON is read by orjson when that gives what the stdlib's ``json.loads`` would: for a body that reads and
validates. A body orjson refuses (NaN and Infinity literals, lone surrogates, integers past 64 bits it
cannot hold as floats, a UTF-8 BOM or another encoding, …) or that does not validate (an integer past 64
bits orjson reads as a float, …) is read again by the stdlib, whose reading then decides the answer
(and its error message); so is a body with enough brackets to nest as deep as the stdlib's recursion
limit, where orjson's own limit (1024 levels) differs from it.
"""

from __future__ import annotations

import email.message
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

import orjson
from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.auth import ApiKeys
from app.api.drain import CLOSE, Drain, refuse, with_close
from app.api.errors import (
    ERROR_TABLE,
    SCOPE_ERROR_TYPE,
    TOO_DEEP,
    send_error,
    server_fault,
    unreadable_body_message,
    validation_error,
    validation_message,
)
from app.api.http.body_limit import declared_length, too_large
from app.api.priority import SCOPE_URGENCY, urgency
from app.engine.priority import DEFAULT_URGENCY, URGENCY
from app.errors import (
    ClientGone,
    InternalError,
    MalformedBody,
    NotReady,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    ValidationFailed,
)
from app.tasks.service import Service
from app.telemetry.metrics import Metrics
from app.telemetry.observe import SCOPE_INPUTS, Observer, count_inputs, traceparent

log = logging.getLogger(__name__)

Endpoint = Callable[[Any, Request, Service], Awaitable[Response]]
# path → (the request body's model, the route function)
FastRoutes = dict[str, tuple[type[BaseModel], Endpoint]]

# A body with fewer opening brackets than this nests less deep, far below the stdlib parser's recursion
# limit (1000 frames, less those of the stack below it): orjson may read it. No request nests past 4.
_SHALLOW = 512
_INTERNAL = ERROR_TABLE[InternalError].error_type
_NO_BODY = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}


def fast_routes(*routers: APIRouter) -> FastRoutes:
    """The POST routes of ``routers`` whose function takes a JSON ``body`` model: read from the routes
    themselves, so a new data route is served by the fast path without being listed twice."""
    routes: FastRoutes = {}
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute) or "POST" not in (route.methods or ()):
            continue
        model = get_type_hints(route.endpoint).get("body")
        if isinstance(model, type) and issubclass(model, BaseModel):
            routes[route.path] = (model, route.endpoint)
    return routes


class DataPath:
    """POST on a data route, served whole (see the module); every other request goes on to ``app``.

    Args:
        app: the rest: the middleware stack and FastAPI.
        routes: the data routes (:func:`fast_routes`); each function answers with
            :func:`app.api.http.routes.json_response`.
        state: the app's state, where the lifespan leaves the service.
        keys: the API keys; None when none are configured.
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: FastRoutes,
        *,
        state: State,
        metrics: Metrics,
        drain: Drain,
        keys: ApiKeys | None,
        max_body_bytes: int,
        observer: Observer | None = None,
    ) -> None:
        self.app = app
        self.routes = routes
        self.state = state
        self.metrics = metrics
        self.drain = drain
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        # Traces and JSON log lines: None when both are off (nothing per request then).
        self.observer = observer if observer is not None and observer.active else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        observer = self.observer
        span = observer.begin("http", scope["path"], traceparent(scope)) if observer is not None else None
        try:
            status = await self._serve(route, scope, receive, send)
        except Exception:  # only sending can raise here; uvicorn logs it
            scope.setdefault(SCOPE_ERROR_TYPE, _INTERNAL)
            raise
        finally:
            self.metrics.request_done(
                scope["path"],
                status,
                time.perf_counter() - started,
                "http",
                scope.get(SCOPE_URGENCY, DEFAULT_URGENCY),
            )
            reason = scope.get(SCOPE_ERROR_TYPE)
            if reason is not None:
                self.metrics.failure(reason)
            if observer is not None:
                observer.end(span, "http", scope["path"], status, scope.get(SCOPE_INPUTS, 0), reason)

    async def _serve(
        self, route: tuple[type[BaseModel], Endpoint], scope: Scope, receive: Receive, send: Send
    ) -> int:
        """Answer the request; the status sent."""
        if self.drain.draining:
            return await refuse(scope, receive, send, self.max_body_bytes)
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
        if self.keys is not None:
            problem, key_urgency = self.keys.check(authorization)
            if problem is not None:
                return await self._error(Unauthorized(problem), scope, send)
        if priority is not None or key_urgency is not None:
            scope[SCOPE_URGENCY] = chosen = urgency(priority, key_urgency)
            URGENCY.set(chosen)
        if declared_over:
            return await self._error(too_large(self.max_body_bytes), scope, send)
        model, endpoint = route
        try:
            service: Service | None = getattr(self.state, "service", None)
            if service is None:
                raise NotReady("the model is still loading")
            body = parsed(model, await self._body(receive), content_type)
            if self.observer is not None:
                scope[SCOPE_INPUTS] = count_inputs(body)
            response = await endpoint(body, Request(scope, receive), service)
        except ServiceError as exc:
            return await self._error(exc, scope, send)
        except Exception as exc:  # a server fault: logged, answered 500 like every other route's
            log.exception("server fault on POST %s", scope["path"], exc_info=exc)
            return await self._error(server_fault(), scope, send)
        headers = response.raw_headers
        if self.drain.closing:  # accepted before the signal (or retirement), answered after: it closes
            headers = with_close(headers)
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        return response.status_code

    async def _error(self, exc: ServiceError, scope: Scope, send: Send) -> int:
        # A 413 leaves the rest of the body unread: the connection cannot be reused.
        close = isinstance(exc, PayloadTooLarge) or self.drain.closing
        return await send_error(exc, scope, send, [CLOSE] if close else ())

    async def _body(self, receive: Receive) -> bytes:
        """The request body, counted against the limit as it comes.

        Raises:
            PayloadTooLarge: over the limit (the rest is not read).
            ClientGone: the client left before the end of it.
        """
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes = message.get("body", b"")  # the whole body in one message: the common case
            if len(body) > self.max_body_bytes:
                raise too_large(self.max_body_bytes)
            return body
        chunks: list[bytes] = []
        size = 0
        while True:
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise too_large(self.max_body_bytes)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
            elif message["type"] == "http.disconnect":
                raise ClientGone("client disconnected")
            message = await receive()


def parsed(model: type[BaseModel], raw: bytes, content_type: bytes | None) -> BaseModel:
    """The body as ``model``, read as FastAPI reads a JSON body model (see the module for orjson).

    Raises:
        MalformedBody: not JSON (or not sent as JSON), not UTF-8, nested too deep.
        ValidationFailed: no body, or not valid for ``model``; the message says which.
    """
    if not raw:
        raise ValidationFailed(validation_message([_NO_BODY]))
    if not _is_json(content_type):
        return _validated(model, raw)  # bytes, which fail validation with a message saying why
    if len(raw) < _SHALLOW or raw.count(b"[") + raw.count(b"{") < _SHALLOW:
        try:
            return model.model_validate(orjson.loads(raw))
        except (ValueError, RecursionError):  # orjson's JSONDecodeError, pydantic's ValidationError
            pass  # the stdlib's reading decides, and words the error
    return _validated(model, _stdlib_json(raw))


def _is_json(content_type: bytes | None) -> bool:
    """Whether FastAPI would parse a body of this ``Content-Type`` as JSON: ``application/json`` or
    ``application/*+json``, parameters allowed."""
    if content_type == b"application/json":
        return True
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _stdlib_json(raw: bytes) -> Any:
    """``json.loads``, with FastAPI's errors in the service's words.

    Raises:
        MalformedBody: not valid JSON, nested too deep, or not readable as JSON at all.
    """
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "ctx": {"error": exc.msg},
        }
        raise MalformedBody(validation_message([error])) from None
    except RecursionError:
        raise MalformedBody(TOO_DEEP) from None
    except Exception:  # UnicodeDecodeError, ValueError: as FastAPI, a body it cannot read
        raise MalformedBody(unreadable_body_message("There was an error parsing the body")) from None


def _validated(model: type[BaseModel], body: Any) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
