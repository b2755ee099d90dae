"""Typed errors and the ONE table that turns them into HTTP.

The engine and the service raise these and know nothing of HTTP. :data:`ERROR_TABLE` maps each type to
a status and an ``error_type``; the exception handlers, the 413 middleware and every route's OpenAPI
``responses=`` all read it. Every error body has one shape: ``{"error": message, "error_type": type}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger(__name__)

# Seconds a client is told to wait after a 429; batches take milliseconds, so one second is ample.
RETRY_AFTER_S = 1


class ServiceError(Exception):
    """Base of every error the service answers with; the subclass picks the row of the table."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EmptyInput(ServiceError):
    """No input, or an empty string as an input."""


class PayloadTooLarge(ServiceError):
    """The request body is larger than ``max_body_bytes``."""


class ValidationFailed(ServiceError):
    """The request is well-formed JSON but asks for something out of bounds or of the wrong type."""


class Unsupported(ServiceError):
    """The loaded model cannot do what was asked (e.g. fill-mask without a masked-LM head)."""


class NotFound(ServiceError):
    """No such route."""


class MethodNotAllowed(ServiceError):
    """The route exists but not for this method."""


class Overloaded(ServiceError):
    """No admission permits left; retry later."""


class NotReady(ServiceError):
    """The model is still loading or warming up."""


class ClientGone(ServiceError):
    """The client disconnected before the answer was ready; nobody reads the response."""


class InternalError(ServiceError):
    """A server fault (a broken invariant); never caused by an input. Logged with its traceback."""


@dataclass(frozen=True)
class ErrorRow:
    status: int
    error_type: str
    description: str


ERROR_TABLE: dict[type[ServiceError], ErrorRow] = {
    EmptyInput: ErrorRow(400, "empty", "Empty input."),
    Unsupported: ErrorRow(400, "unsupported", "The loaded model cannot serve this request."),
    NotFound: ErrorRow(404, "not_found", "No such route."),
    MethodNotAllowed: ErrorRow(405, "method_not_allowed", "Method not allowed on this route."),
    PayloadTooLarge: ErrorRow(413, "payload_too_large", "Request body over the size limit."),
    ValidationFailed: ErrorRow(422, "validation", "Invalid request."),
    ClientGone: ErrorRow(499, "client_closed", "The client left before the answer was ready."),
    Overloaded: ErrorRow(429, "overloaded", "Too many inputs in flight; retry after Retry-After seconds."),
    InternalError: ErrorRow(500, "internal", "Server fault."),
    NotReady: ErrorRow(503, "unhealthy", "The model is not ready yet."),
}

# The rows every data route can answer besides its own.
COMMON_ERRORS: tuple[type[ServiceError], ...] = (PayloadTooLarge, ValidationFailed, Overloaded, NotReady)


class ErrorBody(BaseModel):
    error: str
    error_type: str


def row_for(exc: ServiceError) -> ErrorRow:
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    raise TypeError(f"{type(exc).__name__} has no row in ERROR_TABLE")


def error_parts(exc: ServiceError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """Status, JSON body and headers for ``exc``: for callers below FastAPI (the ASGI middleware)."""
    row = row_for(exc)
    body = orjson.dumps({"error": exc.message, "error_type": row.error_type})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if row.status == 429:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    return row.status, body, headers


def error_response(exc: ServiceError) -> Response:
    status, body, headers = error_parts(exc)
    return Response(
        content=body,
        status_code=status,
        headers={k.decode(): v.decode() for k, v in headers if k != b"content-length"},
        media_type="application/json",
    )


def openapi_responses(*errors: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that can raise ``errors`` (plus :data:`COMMON_ERRORS`)."""
    out: dict[int | str, dict[str, Any]] = {}
    for cls in (*errors, *COMMON_ERRORS):
        row = ERROR_TABLE[cls]
        entry = out.setdefault(row.status, {"model": ErrorBody, "description": ""})
        entry["description"] = "; ".join(filter(None, [entry["description"], row.description]))
    return out


# Parts of a pydantic error location that name a type tried in a union, not a field.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "tuple", "body"})


def _validation_message(exc: RequestValidationError) -> str:
    parts: list[str] = []
    for err in exc.errors()[:10]:
        loc = ".".join(
            str(p) for p in err.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))
        )
        part = f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid"))
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "invalid request"


async def _on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(ValidationFailed(_validation_message(exc)))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    by_status: dict[int, type[ServiceError]] = {
        404: NotFound,
        405: MethodNotAllowed,
        413: PayloadTooLarge,
        # FastAPI answers 400 when a body cannot be read at all; for us that is a validation failure.
        400: ValidationFailed,
    }
    cls = by_status.get(exc.status_code)
    if cls is None:
        raise TypeError(f"HTTP {exc.status_code} ({exc.detail}) has no row in ERROR_TABLE")
    return error_response(cls(str(exc.detail)))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("server fault on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(InternalError(f"internal error: {type(exc).__name__}"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
