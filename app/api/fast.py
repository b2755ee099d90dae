"""The data routes' fast path: a POST body read, parsed and validated by one plain function.

The FastAPI routes in :mod:`app.api.routes` declare the API (OpenAPI, docs) and serve everything else;
for POST on a data route this middleware, the innermost, calls the same route function directly. It
skips what FastAPI adds per request (exception and exit-stack middleware, routing, the dependency solver,
its parameter parsing): a py-spy profile of 64 clients × 32 texts on the tiny model put that layer at
over a third of the event loop's samples, and the service's own work at 14% (issue 13).

It reads and checks the body exactly as FastAPI does, so every answer is the same: JSON only with a JSON
``Content-Type``, the same error for a body that is not valid JSON (position and reason), a missing
body, a body that is not an object, and fields that do not validate (the schema models'
``model_validate``, strict), all through :func:`app.api.errors.validation_message`; typed errors through
the one error table; anything else is a logged server fault (500).
"""

from __future__ import annotations

import email.message
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import TOO_DEEP, send_error, unreadable_body_message, validation_message
from app.errors import ClientGone, InternalError, NotReady, ServiceError, ValidationFailed
from app.service import Service

log = logging.getLogger(__name__)

Endpoint = Callable[[Any, Request, Service], Awaitable[Response]]
# path → (the request body's model, the route function)
FastRoutes = dict[str, tuple[type[BaseModel], Endpoint]]


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


class FastPath:
    def __init__(self, app: ASGIApp, routes: FastRoutes) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        model, endpoint = route
        request = Request(scope, receive)
        try:
            service: Service | None = getattr(scope["app"].state, "service", None)
            if service is None:
                raise NotReady("the model is still loading")
            body = await _body(request)
            if body is _EMPTY:
                missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
                raise ValidationFailed(validation_message([missing]))
            try:
                parsed = model.model_validate(body)
            except ValidationError as exc:
                raise ValidationFailed(
                    validation_message([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
                ) from None
            response = await endpoint(parsed, request, service)
        except ServiceError as exc:
            await send_error(exc, scope, send)
            return
        except ClientDisconnect:
            await send_error(ClientGone("client disconnected"), scope, send)
            return
        except Exception as exc:  # a server fault: logged, answered 500 like every other route's
            log.exception("server fault on POST %s", scope["path"], exc_info=exc)
            await send_error(InternalError(f"internal error: {type(exc).__name__}"), scope, send)
            return
        await response(scope, receive, send)


_EMPTY = object()


async def _body(request: Request) -> Any:
    """The body as FastAPI reads it for a JSON model: parsed only under a JSON Content-Type, else the
    bytes (which then fail validation with a message saying so); ``_EMPTY`` when there is none.

    Raises:
        ValidationFailed: not valid JSON, or not readable as JSON at all.
    """
    raw = await request.body()
    if not raw:
        return _EMPTY
    content_type = request.headers.get("content-type")
    if not content_type:
        return raw
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "ctx": {"error": exc.msg},
        }
        raise ValidationFailed(validation_message([error])) from None
    except RecursionError:
        raise ValidationFailed(TOO_DEEP) from None
    except Exception:  # UnicodeDecodeError, ValueError: as FastAPI, a body it cannot read
        raise ValidationFailed(unreadable_body_message("There was an error parsing the body")) from None
