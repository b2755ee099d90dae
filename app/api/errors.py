"""The ONE table that turns the typed errors of :mod:`app.errors` into HTTP, and everything that reads it.

:data:`ERROR_TABLE` maps each type to a status, an ``error_type`` and an OpenAI error type; the exception
handlers, :func:`send_error` (for the ASGI middleware below FastAPI) and every route's OpenAPI
``responses=`` all read it. An error body has one of four shapes, picked by the route:
``{"error": message, "error_type": type}``, or on the OpenAI-compatible routes OpenAI's
``{"error": {"message": message, "type": openai_type, "code": type}}``, on Jina's rerank route Jina's
``{"detail": message}`` and on Cohere's routes Cohere's ``{"message": message}`` (each with ``error_type``
beside). Each error response records its
``error_type`` in the request scope, where the metrics middleware counts it as a failure reason.

A server fault (:class:`~app.errors.InternalError`, a 500, whatever raised it) answers only that it
happened and an ``error_id`` (in the body, and in the ``x-error-id`` header; over gRPC in the message and
the ``error-id`` trailing metadata): its text, the server's insides, goes to the log under the same id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope, Send

from app.api.field_errors import field_message
from app.errors import (
    FAULT_MESSAGE,
    ClientGone,
    EmptyInput,
    InternalError,
    MalformedBody,
    MethodNotAllowed,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    Unavailable,
    UnknownModel,
    Unsupported,
    ValidationFailed,
    json_kind,
    log_fault,
)

# Seconds a client is told to wait after a 429; batches take milliseconds, so one second is ample.
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ErrorRow:
    status: int
    error_type: str
    description: str
    openai_type: str  # the ``type`` OpenAI's API gives the same kind of error
    grpc: str  # the gRPC status code (its name in grpc.StatusCode) the same error answers over gRPC


_INVALID = "invalid_request_error"

ERROR_TABLE: dict[type[ServiceError], ErrorRow] = {
    EmptyInput: ErrorRow(400, "empty", "Empty input.", _INVALID, "INVALID_ARGUMENT"),
    MalformedBody: ErrorRow(
        400,
        "malformed",
        "The body cannot be read: not JSON, not UTF-8, or not sent as JSON.",
        _INVALID,
        "INVALID_ARGUMENT",
    ),
    Unsupported: ErrorRow(
        400, "unsupported", "The loaded model cannot serve this request.", _INVALID, "FAILED_PRECONDITION"
    ),
    Unauthorized: ErrorRow(
        401,
        "unauthorized",
        "Missing or unknown API key (Authorization: Bearer <key>).",
        "authentication_error",
        "UNAUTHENTICATED",
    ),
    NotFound: ErrorRow(404, "not_found", "No such route.", _INVALID, "UNIMPLEMENTED"),
    UnknownModel: ErrorRow(
        404,
        "model_not_found",
        "No such model here; the message lists the served ones.",
        _INVALID,
        "NOT_FOUND",
    ),
    MethodNotAllowed: ErrorRow(
        405, "method_not_allowed", "Method not allowed on this route.", _INVALID, "UNIMPLEMENTED"
    ),
    PayloadTooLarge: ErrorRow(
        413, "payload_too_large", "Request body over the size limit.", _INVALID, "RESOURCE_EXHAUSTED"
    ),
    ValidationFailed: ErrorRow(422, "validation", "Invalid request.", _INVALID, "INVALID_ARGUMENT"),
    ClientGone: ErrorRow(
        499, "client_closed", "The client left before the answer was ready.", _INVALID, "CANCELLED"
    ),
    Overloaded: ErrorRow(
        429,
        "overloaded",
        "Too many inputs in flight; retry after Retry-After seconds.",
        "rate_limit_error",
        "RESOURCE_EXHAUSTED",
    ),
    InternalError: ErrorRow(500, "internal", "Server fault.", "server_error", "INTERNAL"),
    NotReady: ErrorRow(503, "unhealthy", "The model is not ready yet.", "server_error", "UNAVAILABLE"),
    Unavailable: ErrorRow(
        503,
        "unavailable",
        "This worker cannot serve (failed warm-up or inference thread); it is being replaced: retry.",
        "server_error",
        "UNAVAILABLE",
    ),
}

# The embeddings routes in OpenAI's terms; errors there, and on every other /v1/ path, take OpenAI's shape
# so OpenAI clients can read them.
OPENAI_PATHS = frozenset({"/v1/embeddings", "/embeddings"})
# Jina's rerank route, whose errors take Jina's shape ``{"detail": message}``, and Cohere's routes, whose
# errors take Cohere's ``{"message": message}``: each the shape its clients read.
JINA_PATHS = frozenset({"/v1/rerank"})
COHERE_PATHS = frozenset({"/v2/rerank", "/v2/embed", "/v1/embed"})
# Where an error response leaves its error_type for the metrics middleware.
SCOPE_ERROR_TYPE = "zhembed.error_type"

# The rows every data route can answer besides its own (401 only with API keys on).
COMMON_ERRORS: tuple[type[ServiceError], ...] = (
    Unauthorized,
    PayloadTooLarge,
    MalformedBody,
    ValidationFailed,
    Overloaded,
    NotReady,
    Unavailable,
)


class ErrorBody(BaseModel):
    error: str
    error_type: str
    error_id: str | None = Field(
        default=None, description="A server fault's (500) id, under which the server's log holds it."
    )


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    error_id: str | None = Field(
        default=None, description="A server fault's (500) id, under which the server's log holds it."
    )


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


class JinaErrorBody(BaseModel):
    detail: str
    error_type: str
    error_id: str | None = None


class CohereErrorBody(BaseModel):
    message: str
    error_type: str
    error_id: str | None = None


def row_for(exc: ServiceError) -> ErrorRow:
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    raise TypeError(f"{type(exc).__name__} has no row in ERROR_TABLE")


def error_parts(exc: ServiceError, scope: Scope) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """Status, JSON body and headers for ``exc`` answering the request of ``scope``.

    For callers below FastAPI (the ASGI middleware) as well as the exception handlers. The body's shape
    follows the route; the error type is left in the scope for the metrics.
    """
    row = row_for(exc)
    scope[SCOPE_ERROR_TYPE] = row.error_type
    path = str(scope.get("path", ""))
    message, error_id = told(exc)
    detail: dict[str, Any] = {"error_id": error_id} if error_id is not None else {}
    if path in JINA_PATHS:
        payload: dict[str, Any] = {"detail": message, "error_type": row.error_type, **detail}
    elif path in COHERE_PATHS:
        payload = {"message": message, "error_type": row.error_type, **detail}
    elif path in OPENAI_PATHS or path.startswith("/v1/"):
        payload = {"error": {"message": message, "type": row.openai_type, "code": row.error_type, **detail}}
    else:
        payload = {"error": message, "error_type": row.error_type, **detail}
    body = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error_id is not None:
        headers.append((b"x-error-id", error_id.encode()))
    if row.status == 429:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    if row.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return row.status, body, headers


def told(exc: ServiceError) -> tuple[str, str | None]:
    """What a client is told of ``exc``, and its error id (None but for a server fault): a server fault is
    logged here (once, if its site has not logged it) with its whole text under that id, and answered
    with :data:`~app.errors.FAULT_MESSAGE` and the id alone."""
    if not isinstance(exc, InternalError):
        return exc.message, None
    log_fault(exc)
    return f"{FAULT_MESSAGE} {exc.error_id}", exc.error_id


def error_response(
    exc: ServiceError, request: Request, extra_headers: Mapping[str, str] | None = None
) -> Response:
    status, body, headers = error_parts(exc, request.scope)
    return Response(
        content=body,
        status_code=status,
        headers={k.decode(): v.decode() for k, v in headers if k != b"content-length"}
        | dict(extra_headers or {}),
        media_type="application/json",
    )


def openapi_responses(
    *errors: type[ServiceError], body: type[BaseModel] = ErrorBody
) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that can raise ``errors`` (plus :data:`COMMON_ERRORS`), each with the
    error ``body`` of the route's API (:class:`ErrorBody`, or OpenAI's, Jina's, Cohere's)."""
    out: dict[int | str, dict[str, Any]] = {}
    model = body
    for cls in (*errors, *COMMON_ERRORS):
        row = ERROR_TABLE[cls]
        entry = out.setdefault(row.status, {"model": model, "description": ""})
        entry["description"] = "; ".join(filter(None, [entry["description"], row.description]))
    return out


def validation_message(errors: Sequence[Any]) -> str:
    """One message for a request's validation errors (pydantic's, with ``body`` first in each location),
    in the service's words rather than pydantic's: the field as the client wrote it, what it must be,
    and what was sent."""
    parts: list[str] = []
    for err in list(errors)[:10]:
        if err.get("type") == "json_invalid":
            where = err.get("loc", ("body", "?"))[-1]
            detail = err.get("ctx", {}).get("error", "")
            parts.append(f"the body is not valid JSON: {detail} at character {where}")
            continue
        if tuple(err.get("loc", ())) == ("body",) and err.get("type") == "missing":
            parts.append("the request has no body: send a JSON object")
            continue
        if tuple(err.get("loc", ())) == ("body",) and isinstance(err.get("input"), bytes):
            # FastAPI hands over the raw bytes when the Content-Type is not JSON (or is missing).
            parts.append("the body was not read as JSON: send it with Content-Type: application/json")
            continue
        if tuple(err.get("loc", ())) == ("body",) and not isinstance(err.get("input"), dict):
            parts.append(f"the body must be a JSON object, not {json_kind(err.get('input'))}")
            continue
        part = field_message(err)
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "invalid request"


def _unreadable(err: Any) -> bool:
    """Whether a validation error says the body could not be read as JSON at all."""
    if err.get("type") == "json_invalid":
        return True
    return tuple(err.get("loc", ())) == ("body",) and isinstance(err.get("input"), bytes)


def validation_error(errors: Sequence[Any]) -> ServiceError:
    """The error a request's validation errors answer as: a 400 (:class:`MalformedBody`) where the body
    could not be read as JSON, else a 422 (:class:`ValidationFailed`); the message from
    :func:`validation_message` either way."""
    cls = MalformedBody if any(_unreadable(e) for e in errors) else ValidationFailed
    return cls(validation_message(errors))


# Starlette's own HTTP errors (routing, body reading) by status: the rows they answer as.
HTTP_STATUS_ERRORS: dict[int, type[ServiceError]] = {
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    # FastAPI answers 400 when a body cannot be read at all.
    400: MalformedBody,
}


async def send_error(
    exc: ServiceError, scope: Scope, send: Send, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> int:
    """Answer the request of ``scope`` with ``exc`` straight from ASGI (the middleware, the data path).

    ``extra_headers`` replace any of the same name (e.g. ``connection: close``). Returns the status.
    """
    status, body, headers = error_parts(exc, scope)
    extra = list(extra_headers)
    if extra:
        names = {name for name, _ in extra}
        headers = [h for h in headers if h[0] not in names] + extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


async def _on_service_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ServiceError):
        raise TypeError(f"the ServiceError handler got {type(exc).__name__}")
    return error_response(exc, request)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, RequestValidationError):
        raise TypeError(f"the validation handler got {type(exc).__name__}")
    return error_response(validation_error(exc.errors()), request)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, StarletteHTTPException):
        raise TypeError(f"the HTTP error handler got {type(exc).__name__}")
    cls = HTTP_STATUS_ERRORS.get(exc.status_code)
    if cls is None:
        raise TypeError(f"HTTP {exc.status_code} ({exc.detail}) has no row in ERROR_TABLE")
    message = str(exc.detail)
    headers = dict(exc.headers or {})
    if exc.status_code == 400:
        message = unreadable_body_message(message)
    elif exc.status_code == 404:
        message = f"there is no route {request.url.path}: the routes are listed at /docs"
    elif exc.status_code == 405:
        # Starlette's 405 names the allowed methods in its Allow header; keep it, and say it.
        allowed = headers.get("Allow") or headers.get("allow") or ""
        message = f"{request.method} is not allowed on {request.url.path}: use {allowed or 'another method'}"
    return error_response(cls(message), request, headers)


def unreadable_body_message(detail: str) -> str:
    """A body no JSON parser could read: bytes that are not UTF-8, an integer too long to convert."""
    return f"{detail}: it must be UTF-8 JSON that Python's json module can read"


# What a body nested past the parser's depth (RecursionError) is told; no request here nests deeper
# than four levels.
TOO_DEEP = (
    "the body nests arrays or objects deeper than the JSON parser reads; no request here nests more than "
    "four levels"
)


def server_fault(exc: BaseException, where: str) -> InternalError:
    """An unexpected exception ``exc`` (a bug, not the request's fault) on ``where`` (e.g. ``POST /embed``)
    as the :class:`InternalError` it answers, over HTTP (500) and gRPC (INTERNAL) alike; logged now, with
    its traceback, under the error id the client is told (:func:`told`)."""
    return log_fault(InternalError(f"{where}: {type(exc).__name__}: {exc}"), exc)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    return error_response(server_fault(exc, f"{request.method} {request.url.path}"), request)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
