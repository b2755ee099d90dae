"""What every gRPC call shares with every HTTP request: the drain, API keys, the service, errors, metrics.

A call is refused while the server drains (UNAVAILABLE) or without a valid ``authorization: Bearer``
key (UNAUTHENTICATED); the service's typed errors become status codes by the one error table
(:data:`app.api.errors.ERROR_TABLE`, its ``grpc`` column) with the same messages as over HTTP; a request
message is validated by the HTTP route's own schema, so the same mistake gets the same words. Each call is
counted as an HTTP request is, with ``protocol="grpc"``, its method as the route and its status code's
name as the status. The metadata ``priority`` carries what HTTP's ``Priority`` header does (RFC 9218:
``u=0`` … ``u=7``), read by the same function (:func:`app.api.urgency.urgency`), with the API key's
default urgency where it sets none; the call runs at that urgency (:data:`app.engine.priority.URGENCY`).
Of the HTTP gates (:mod:`app.api.http.gates`) a call runs the ones that apply: draining
(:func:`app.api.drain.shutting_down`), the key (:meth:`app.api.auth.ApiKeys.check`) and the urgency. The
metadata ``model`` names the model that answers, as a body's ``model`` does over HTTP (none: the default
of the HTTP route the method is the twin of, :data:`ROUTES`; :class:`app.tasks.models.Models`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
from pydantic import BaseModel, ValidationError

from app.api.auth import ApiKeys
from app.api.drain import Drain, shutting_down
from app.api.errors import row_for, server_fault, told, validation_message
from app.api.urgency import urgency
from app.engine.admission import Permits
from app.engine.priority import URGENCY
from app.errors import NotReady, ServiceError, Unauthorized, ValidationFailed
from app.tasks.models import Models
from app.tasks.service import Service
from app.telemetry.context import CURRENT_INPUTS, CURRENT_MODEL
from app.telemetry.metrics import Metrics
from app.telemetry.observe import Observer, count_inputs

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Request = TypeVar("Request")
Response = TypeVar("Response")

# Requests of one stream run at once, at most: each is admitted like any other, answers go out in order.
STREAM_WINDOW = 32

# Each method (its stream's too) by the HTTP route it is the twin of: whose default model it takes.
ROUTES = {
    "Embed": "/embed",
    "EmbedAll": "/embed_all",
    "EmbedSparse": "/embed_sparse",
    "Predict": "/predict",
    "PredictPair": "/predict",
    "Rerank": "/rerank",
    "Tokenize": "/tokenize",
    "Decode": "/tokenize",
    "Similarity": "/similarity",
    "FillMask": "/fill-mask",
    "Info": "/info",
}


def route_of(method: str) -> str:
    """The HTTP route a gRPC method (``/tei.v1.Embed/EmbedStream``) is the twin of."""
    name = method.rpartition("/")[2]
    return ROUTES.get(name.removesuffix("Stream"), ROUTES.get(name, method))


def validated(schema: type[M], fields: dict[str, Any]) -> M:
    """``fields`` (a message's, as the HTTP body would carry them) checked by the HTTP route's schema.

    Raises:
        ValidationFailed: with the message the HTTP route gives for the same mistake.
    """
    try:
        body = schema.model_validate(fields)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
        raise ValidationFailed(validation_message(errors)) from None
    CURRENT_INPUTS.set(count_inputs(body))
    return body


class Calls:
    def __init__(
        self,
        service: Callable[[], Service | None],
        metrics: Metrics,
        drain: Drain,
        keys: ApiKeys | None,
        observer: Observer | None = None,
        models: Callable[[], Models | None] | None = None,
    ) -> None:
        """``service``: the (default) model's, once loaded; ``models``: every model's, which a call's
        metadata ``model`` chooses from (None: always ``service``)."""
        self._service = service
        self._models = models
        self.metrics = metrics
        self.drain = drain
        self.keys = keys
        # Traces and JSON log lines: None when both are off (nothing per call then).
        self.observer = observer if observer is not None and observer.active else None

    def _begin(self, method: str, context: grpc.aio.ServicerContext) -> Any:
        if self.observer is None:
            return None
        CURRENT_INPUTS.set(0)
        parent = next((v for k, v in context.invocation_metadata() or () if k == "traceparent"), None)
        return self.observer.begin("grpc", method, parent if isinstance(parent, str) else None)

    def _done(self, method: str, code: str, started: float, span: Any) -> None:
        model = CURRENT_MODEL.get()
        self.metrics.request_done(method, code, time.perf_counter() - started, "grpc", URGENCY.get(), model)
        if self.observer is not None:
            reason = None if code == "OK" else code.lower()
            self.observer.end(span, "grpc", method, code, CURRENT_INPUTS.get(), reason, model)

    def _admit(self, method: str, context: grpc.aio.ServicerContext) -> Service:
        """The service of the model the call names (metadata ``model``, else ``method``'s default), once
        the call may use it; sets the call's urgency for the engine.

        Raises:
            ServiceError: draining (UNAVAILABLE), no valid key (UNAUTHENTICATED), not loaded yet, an
                unknown model (NOT_FOUND).
        """
        if self.drain.draining:
            raise shutting_down()
        metadata = context.invocation_metadata() or ()
        key_urgency = None
        if self.keys is not None:
            authorization = next((v for k, v in metadata if k == "authorization"), None)
            raw = authorization.encode() if isinstance(authorization, str) else authorization
            problem, key_urgency = self.keys.check(raw)
            if problem is not None:
                raise Unauthorized(problem)
        lines = [v if isinstance(v, str) else v.decode("latin-1") for k, v in metadata if k == "priority"]
        if lines or key_urgency is not None:
            URGENCY.set(urgency(", ".join(lines) if lines else None, key_urgency))
        service = self._service()
        if service is None:
            raise NotReady("the model is still loading")
        models = self._models() if self._models is not None else None
        if models is not None:
            named = next((v for k, v in metadata if k == "model"), None)
            name = named.decode("utf-8", "replace") if isinstance(named, bytes) else named
            service = models.pick(name, route_of(method))
        return service

    async def unary(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[Service], Awaitable[T]],
    ) -> T:
        """Run one unary call's ``work`` with the service, as described in the module."""
        started = time.perf_counter()
        code = "OK"
        CURRENT_MODEL.set("")
        span = self._begin(method, context)
        try:
            return await work(self._admit(method, context))
        except ServiceError as exc:
            code = row_for(exc).grpc
            await self._fail(context, exc)
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a server fault: logged, answered INTERNAL, as HTTP answers 500
            code = "INTERNAL"
            await self._fail(context, server_fault(exc, f"gRPC {method}"))
            raise
        finally:
            self._done(method, code, started, span)

    async def stream(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        requests: AsyncIterator[Request],
        work: Callable[[Service, Request], Coroutine[Any, Any, Response]],
    ) -> AsyncIterator[Response]:
        """Answer each request of a stream with ``work``, in order; up to :data:`STREAM_WINDOW` at once.

        An answer holds permits from the moment its work ends until it is written (:func:`_answered`), so
        the answers a stream keeps for a client that does not read count against admission; when they
        cannot be had the stream ends RESOURCE_EXHAUSTED. The first error ends the stream with its status
        (the answers before it were sent).
        """
        started = time.perf_counter()
        code = "OK"
        CURRENT_MODEL.set("")
        span = self._begin(method, context)
        tasks: asyncio.Queue[asyncio.Task[tuple[Response, Permits]] | None] = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_WINDOW)
        reader: asyncio.Task[None] | None = None
        current: asyncio.Task[tuple[Response, Permits]] | None = None
        try:
            service = self._admit(method, context)

            async def read() -> None:
                try:
                    async for request in requests:
                        await room.acquire()
                        tasks.put_nowait(asyncio.create_task(_answered(service, work(service, request))))
                finally:
                    tasks.put_nowait(None)

            reader = asyncio.create_task(read())
            while (current := await tasks.get()) is not None:
                answer, permits = await current
                current = None
                try:
                    yield answer
                finally:
                    permits.release()
                room.release()
            await reader  # the client's own stream error, if any
        except ServiceError as exc:
            code = row_for(exc).grpc
            await self._fail(context, exc)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            code = "INTERNAL"
            await self._fail(context, server_fault(exc, f"gRPC {method}"))
        finally:
            if reader is not None:
                reader.cancel()
            left = [current] if current is not None else []
            while not tasks.empty():
                if (task := tasks.get_nowait()) is not None:
                    left.append(task)
            for task in left:
                _drop(task)
            self._done(method, code, started, span)

    async def _fail(self, context: grpc.aio.ServicerContext, exc: ServiceError) -> None:
        """Abort the call with ``exc``'s status code and message (raises ``AbortError``); a server fault
        with the message and error id the table tells (:func:`~app.api.errors.told`), the id also in the
        trailing metadata ``error-id``."""
        row = row_for(exc)
        self.metrics.failure(row.error_type)
        message, error_id = told(exc)
        metadata: tuple[tuple[str, str], ...] = (("error-type", row.error_type),)
        if error_id is not None:
            metadata += (("error-id", error_id),)
        if row.status == 429:
            metadata += (("retry-after", "1"),)
        await context.abort(grpc.StatusCode[row.grpc], message, metadata)


async def _answered(service: Service, work: Awaitable[Response]) -> tuple[Response, Permits]:
    """``work``'s answer, with permits for it until it is written: as many as its inputs (what
    :func:`validated` counted; one where it counts none), the permits the work held while it ran.

    Raises:
        Overloaded: the budget has no room for the answer (taken as the work gives its own back, at once
            where the work does not await after that, so the budget fills only with another worker's).
    """
    CURRENT_INPUTS.set(0)
    answer = await work
    return answer, service.engine.admit(max(CURRENT_INPUTS.get(), 1))


def _drop(task: asyncio.Task[tuple[Response, Permits]]) -> None:
    """Cancel a stream's request not yet answered, or give back the permits of its unwritten answer."""
    if not task.done():
        task.cancel()
    elif not task.cancelled() and task.exception() is None:
        task.result()[1].release()


Work = Callable[[Service, Any], Coroutine[Any, Any, Any]]


def unary(method: str, work: Work) -> Callable[..., Coroutine[Any, Any, Any]]:
    """A servicer method for a unary call: ``work(service, request)`` through :meth:`Calls.unary`."""

    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.calls.unary(method, context, lambda service: work(service, request))

    handler.__name__ = method.rpartition("/")[2]
    return handler


def streaming(method: str, work: Work) -> Callable[..., AsyncIterator[Any]]:
    """A servicer method for a stream of requests, each answered by ``work`` (:meth:`Calls.stream`)."""

    async def handler(
        self: Any, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for answer in self.calls.stream(method, context, request_iterator, work):
            yield answer

    handler.__name__ = method.rpartition("/")[2]
    return handler
