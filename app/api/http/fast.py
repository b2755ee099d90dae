"""The data routes' HTTP path: a POST to a data route is served by one ASGI function, in front of all else.

The FastAPI routes in :mod:`app.api.http.routes` and :mod:`app.api.http.openai_routes` declare the API (OpenAPI,
docs); FastAPI, behind :class:`app.api.http.gates.GateMiddleware`, serves every other request. For POST on a
data route :class:`DataPath`, the outermost ASGI callable, serves the request in one function and calls the
same route function:

1. the gates (:mod:`app.api.http.gates`), the same functions in the same order as for every other route:
   draining (503), the API key (401), the urgency, the declared body size (413); a streamed body is counted
   as it comes and cut off at the limit (413, :func:`app.api.http.body_limit.read_body`);
2. the body read, parsed and validated exactly as FastAPI does it: JSON only under a JSON
   ``Content-Type``, the same errors for a body that is not valid JSON (position and reason), nests too
   deep, is not UTF-8 (400, ``malformed``), is missing or is not an object, and for fields that do not
   validate (422; the schema models' ``model_validate``, strict), all through
   :func:`app.api.errors.validation_error`;
3. the route function, with the service of the model the body names (``model``), or the route's
   default (:class:`app.tasks.models.Models`); typed errors through the one error table, anything else a
   logged server fault (500); a client that leaves gets its work cancelled (499, ``client_closed``);
4. the answer sent as two ASGI messages (the route's prebuilt byte-pair headers), ``connection: close``
   added while draining or retiring; the request counted
   (:func:`app.api.http.request_metrics.count`).

It runs no middleware, routing or dependency solving of the framework's: each of those costs coroutines,
closures around ``send`` and dicts per request (``python -m loadtest.http_path`` measures the difference).

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

from app.api.drain import refuse, with_close
from app.api.errors import (
    SCOPE_ERROR_TYPE,
    TOO_DEEP,
    server_fault,
    unreadable_body_message,
    validation_error,
    validation_message,
)
from app.api.http.body_limit import read_body
from app.api.http.gates import Gates
from app.api.http.request_metrics import INTERNAL, count
from app.errors import MalformedBody, NotReady, ServiceError, ValidationFailed
from app.tasks.models import Models
from app.tasks.service import Service
from app.telemetry.context import CURRENT_MODEL
from app.telemetry.observe import SCOPE_INPUTS, count_inputs, traceparent

log = logging.getLogger(__name__)

Endpoint = Callable[[Any, Request, Service], Awaitable[Response]]
# path → (the request body's model, the route function)
FastRoutes = dict[str, tuple[type[BaseModel], Endpoint]]

# A body with fewer opening brackets than this nests less deep, far below the stdlib parser's recursion
# limit (1000 frames, less those of the stack below it): orjson may read it. No request nests past 4.
_SHALLOW = 512
# Bytes of a response body sent per ASGI message (a copy of ~0.1 ms).
BODY_PIECE = 1 << 20
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
        app: the rest: the gate middleware and FastAPI.
        routes: the data routes (:func:`fast_routes`); each function answers with
            :func:`app.api.http.routes.json_response`.
        state: the app's state, where the lifespan leaves the service.
        gates: the gates, shared with the middleware in ``app``.
    """

    def __init__(self, app: ASGIApp, routes: FastRoutes, *, state: State, gates: Gates) -> None:
        self.app = app
        self.routes = routes
        self.state = state
        self.gates = gates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        gates = self.gates
        started = time.perf_counter()
        CURRENT_MODEL.set("")  # set once the model is chosen (app.tasks.models)
        status = 500
        observer = gates.observer
        span = observer.begin("http", scope["path"], traceparent(scope)) if observer is not None else None
        try:
            status = await self._serve(route, scope, receive, send)
        except Exception:  # only sending can raise here; uvicorn logs it
            scope.setdefault(SCOPE_ERROR_TYPE, INTERNAL)
            raise
        finally:
            count(gates.metrics, observer, scope["path"], status, started, scope, span)

    async def _serve(
        self, route: tuple[type[BaseModel], Endpoint], scope: Scope, receive: Receive, send: Send
    ) -> int:
        """Answer the request; the status sent."""
        gates = self.gates
        if gates.drain.draining:
            return await refuse(scope, receive, send, gates.max_body_bytes)
        model, endpoint = route
        try:
            content_type = gates.admit(scope, gates.keys)
            service: Service | None = getattr(self.state, "service", None)
            if service is None:
                raise NotReady("the model is still loading")
            body = parsed(model, await read_body(receive, gates.max_body_bytes), content_type)
            if gates.observer is not None:
                scope[SCOPE_INPUTS] = count_inputs(body)
            models: Models | None = getattr(self.state, "models", None)
            if models is not None:  # the model the body names, or the route's default
                service = models.pick(getattr(body, "model", None), scope["path"])
            response = await endpoint(body, Request(scope, receive), service)
        except ServiceError as exc:
            return await gates.answer_error(exc, scope, send)
        except Exception as exc:  # a server fault: logged with an error id, answered 500 with the id alone
            return await gates.answer_error(server_fault(exc, f"POST {scope['path']}"), scope, send)
        headers = response.raw_headers
        if gates.drain.closing:  # accepted before the signal (or retirement), answered after: it closes
            headers = with_close(headers)
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send_body(send, response.body)
        return response.status_code


async def send_body(send: Send, body: bytes | memoryview) -> None:
    """``body`` as one ASGI message, or past :data:`BODY_PIECE` bytes as pieces of that size: the server
    waits for the socket to drain before each next piece, so the event loop never copies tens of
    megabytes into the transport's buffer at once (/embed_all's largest answer is 33 MB)."""
    if len(body) <= BODY_PIECE:
        await send({"type": "http.response.body", "body": body})
        return
    view = memoryview(body)
    for start in range(0, len(body), BODY_PIECE):
        end = start + BODY_PIECE
        await send(
            {"type": "http.response.body", "body": bytes(view[start:end]), "more_body": end < len(body)}
        )


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
