"""OpenAI batch files: each line of OpenAI's Batch API input (``custom_id``, ``method``, ``url``, ``body``)
answered by the HTTP route its ``url`` names, in OpenAI's batch output shape.

A line's body goes through what the server's data path (:mod:`app.api.http.fast`) does for a POST: the
same parsing and validation (:func:`~app.api.http.fast.parsed`), the same route function with the same
service, and errors through the one error table (:func:`~app.api.errors.error_parts`), so the ``body`` of
each output line is byte for byte what the route would answer (a 4xx in the route's own error shape
included). What no route sees (a line that is not JSON, has no ``custom_id`` or repeats one, names a url
not served or a method other than POST) is answered on its own line with ``error`` ``{code, message}``.

Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``, as
OpenAI's batch output file and vLLM's ``run-batch`` write it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request

from app.api.errors import error_parts
from app.api.http.fast import FastRoutes, fast_routes, parsed
from app.api.http.openai_routes import router as openai_router
from app.api.http.retrieval_routes import router as retrieval_router
from app.api.http.routes import router as tei_router
from app.errors import ServiceError
from app.tasks.service import Service

# The urls a batch line may name. Each is served by the HTTP route of that path, found in ROUTERS
# (fast_routes reads each route's body model and function from the router), so a route added to one of
# them, or a router added to ROUTERS, is answered here with no other change. A url listed whose route the
# server does not have is refused per line as unsupported, as is any url not listed.
BATCH_URLS = ("/v1/embeddings", "/v1/rerank", "/v2/embed")
ROUTERS = (openai_router, retrieval_router, tei_router)
JSON = b"application/json"


class JobFault(Exception):
    """A line answered 429 or 5xx: the service, not the line, is at fault; the job stops (what is written
    stays) and a rerun answers that line again."""


@dataclass(frozen=True)
class Line:
    """One request line: its number in the file (from 1), ``custom_id`` as given (None if missing), and
    either the url and body to answer, or the error a line no route sees gets (status, code, message)."""

    number: int
    custom_id: Any
    url: str = ""
    body: bytes = b""
    error: tuple[int, str, str] | None = None
    inputs: int = 1  # the texts it adds to the engine's queue (at most): its input list's length


def batch_routes() -> FastRoutes:
    """url → (body model, route function) for each of :data:`BATCH_URLS` the HTTP API serves."""
    served = fast_routes(*ROUTERS)
    return {url: served[url] for url in BATCH_URLS if url in served}


def _loads(raw: bytes) -> tuple[Any, bool]:
    """A line as JSON, and whether the stdlib read it: where orjson refuses a line (NaN, an integer past
    64 bits, ...) the stdlib reads it, as the server's data path does for a body.

    Raises:
        ValueError: not JSON (the stdlib's message).
    """
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError:
        return json.loads(raw), True


def read_lines(path: Path, routes: FastRoutes) -> Iterator[Line]:
    """The file's request lines in order, a line at a time (blank lines skipped: they are no request),
    each checked as far as it can be without its route. Each custom_id seen is kept to find repeats."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            yield _line(number, raw, routes, seen)


def _line(number: int, raw: bytes, routes: FastRoutes, seen: set[str]) -> Line:
    try:
        request, stdlib = _loads(raw)
    except (ValueError, RecursionError) as exc:
        return Line(number, None, error=(400, "invalid_json", f"line {number} is not JSON: {exc}"))
    if not isinstance(request, dict):
        kind = type(request).__name__
        return Line(
            number, None, error=(400, "invalid_request", f"line {number} is a JSON {kind}, not an object")
        )
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        told = "has no custom_id" if custom_id is None else "has a custom_id that is not a non-empty string"
        given = custom_id if isinstance(custom_id, str) else None
        return Line(number, given, error=(400, "invalid_custom_id", f"line {number} {told}"))
    if custom_id in seen:
        message = f"custom_id {custom_id!r} is used by an earlier line; each line needs its own"
        return Line(number, custom_id, error=(400, "duplicate_custom_id", message))
    seen.add(custom_id)
    method, url = request.get("method", "POST"), request.get("url")
    if not isinstance(url, str) or url not in routes:
        served = ", ".join(routes)
        message = f"url {url!r} is not served here; a line may name {served}"
        return Line(number, custom_id, error=(404, "unsupported_url", message))
    if method != "POST":
        return Line(
            number, custom_id, error=(405, "method_not_allowed", f"method {method!r}: only POST is served")
        )
    body = request.get("body")
    many = [body.get(k) for k in ("input", "texts", "documents")] if isinstance(body, dict) else []
    lists = [v for v in many if isinstance(v, list) and v and not isinstance(v[0], int)]  # ids: one input
    inputs = max([len(v) for v in lists] + [1])
    # Written back as it was read, so the route's parser reads what the line held (NaN included).
    raw_body = b"" if body is None else json.dumps(body).encode() if stdlib else orjson.dumps(body)
    return Line(number, custom_id, url, raw_body, inputs=inputs)


def ids_of(line: Line) -> tuple[str, str]:
    """The output line's ``id`` and ``request_id``: made from the line's number and custom_id, so a
    rerun writes the same ones."""
    digest = hashlib.blake2b(orjson.dumps([line.number, line.custom_id]), digest_size=12).hexdigest()
    return f"batch_req_{digest}", f"req_{digest}"


def record(line: Line, status: int, body: bytes | None, error: dict[str, str] | None = None) -> bytes:
    """One output line, ``body`` (JSON already) spliced in as the route wrote it; ends with a newline."""
    id_, request_id = ids_of(line)
    head = orjson.dumps({"id": id_, "custom_id": line.custom_id})[:-1]
    response = b'{"status_code":%d,"request_id":%s,"body":%s}' % (
        status,
        orjson.dumps(request_id),
        b"null" if body is None else body,
    )
    return b'%s,"response":%s,"error":%s}\n' % (head, response, orjson.dumps(error))


def refused(line: Line) -> bytes:
    """The output line of a line no route sees: its status, no body, and ``error`` ``{code, message}``."""
    if line.error is None:
        raise ValueError(f"line {line.number} is for its route to answer")
    status, code, message = line.error
    return record(line, status, None, {"code": code, "message": message})


class Answerer:
    """Answers lines with the routes and one service."""

    def __init__(self, service: Service, routes: FastRoutes | None = None) -> None:
        self.service = service
        self.routes = batch_routes() if routes is None else routes

    async def answer(self, line: Line) -> tuple[bytes, bool]:
        """The output line of ``line`` and whether it was answered 2xx.

        Raises:
            JobFault: the route answered 429 or 5xx.
        """
        if line.error is not None:
            return refused(line), False
        model, endpoint = self.routes[line.url]
        scope: dict[str, Any] = {"type": "http", "method": "POST", "path": line.url, "headers": []}
        try:
            body = parsed(model, line.body, JSON)
            response = await endpoint(body, Request(scope, _watch_never), self.service)
        except ServiceError as exc:
            status, payload, _ = error_parts(exc, scope)
            if status == 429 or status >= 500:
                raise JobFault(f"line {line.number} ({line.custom_id}): {payload.decode()}") from exc
            return record(line, status, payload), False
        return record(line, response.status_code, bytes(response.body)), 200 <= response.status_code < 300


async def _watch_never() -> dict[str, Any]:
    """What a route that watches for its client's disconnect receives: nothing, ever (a line has no
    client); the watcher is cancelled when the route's work ends."""
    await asyncio.Event().wait()
    raise AssertionError("an event nobody sets was set")
