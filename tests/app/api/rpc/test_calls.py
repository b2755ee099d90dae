"""What every gRPC call shares: a fault of the server's own is answered INTERNAL in the words HTTP's 500
uses, with an error id, never with the exception's class or text (they go to the log, under that id); a
stream's answers waiting to be written hold permits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import grpc
import pytest

from app.api.drain import Drain
from app.api.rpc.calls import Calls
from app.engine.admission import Admission, Permits
from app.errors import FAULT_MESSAGE
from app.telemetry.context import CURRENT_INPUTS
from app.telemetry.metrics import Metrics


class Context:
    """The part of grpc.aio's ServicerContext that Calls uses; abort records and raises as grpc.aio does."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str, Any] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str, metadata: Any = ()) -> None:
        self.aborted = (code, details, metadata)
        raise grpc.aio.AbortError("aborted")


async def _fault(_service: Any) -> Any:
    raise KeyError("/srv/models/secret-path")


def _calls() -> Calls:
    return Calls(lambda: object(), Metrics(), Drain(), None)  # type: ignore[arg-type, return-value]


def test_a_unary_fault_is_internal_with_an_error_id_and_without_the_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    context = Context()
    with caplog.at_level(logging.ERROR, logger="app.errors"), pytest.raises(grpc.aio.AbortError):
        asyncio.run(_calls().unary("/tei.v1.Embed/Embed", context, _fault))
    assert context.aborted is not None
    code, details, metadata = context.aborted
    error_id = dict(metadata)["error-id"]
    assert code == grpc.StatusCode.INTERNAL and details == f"{FAULT_MESSAGE} {error_id}"
    assert "KeyError" not in details and "secret" not in details
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert (
        "gRPC /tei.v1.Embed/Embed: KeyError" in record.getMessage() and "secret-path" in record.getMessage()
    )


def test_a_stream_fault_is_internal_with_an_error_id_and_without_the_exception() -> None:
    context = Context()

    async def requests() -> AsyncIterator[int]:
        yield 1

    async def drain() -> None:
        async for _ in _calls().stream(
            "/tei.v1.Embed/EmbedStream", context, requests(), lambda s, r: _fault(s)
        ):
            pass

    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(drain())
    assert context.aborted is not None
    code, details, metadata = context.aborted
    assert code == grpc.StatusCode.INTERNAL and details == f"{FAULT_MESSAGE} {dict(metadata)['error-id']}"


class Engine:
    """The part of the engine a call uses: admission, with a real budget."""

    def __init__(self, limit: int) -> None:
        self.admission = Admission(limit)

    def admit(self, inputs: int) -> Permits:
        return self.admission.try_acquire(inputs)


class Service:
    def __init__(self, limit: int) -> None:
        self.engine = Engine(limit)


def test_a_stream_that_is_not_read_holds_no_answer_beyond_its_permits() -> None:
    # A client that sends and never reads: every answer the server keeps waiting holds its permits (one
    # input each here), so what it keeps is bounded by the budget, not by the stream's window of 32.
    limit = 4
    service = Service(limit)
    context = Context()
    made: list[int] = []
    sent: list[int] = []

    async def requests() -> AsyncIterator[int]:
        for i in range(1000):
            yield i

    async def work(s: Any, request: int) -> int:
        with s.engine.admit(1):  # as a service method admits its inputs, released when it returns
            CURRENT_INPUTS.set(1)
            await asyncio.sleep(0)
        made.append(request)
        return request

    async def scenario() -> None:
        calls = Calls(lambda: service, Metrics(), Drain(), None)  # type: ignore[arg-type, return-value]
        stream = cast(
            AsyncGenerator[int, None],
            calls.stream("/tei.v1.Embed/EmbedStream", context, requests(), work),
        )
        sent.append(await anext(stream))  # the first answer is being written: the client reads no more
        for _ in range(1000):  # let every task of the stream run as far as it can
            await asyncio.sleep(0)
            held = len(made) - len(sent) + 1  # finished, not written (the one being written included)
            assert held <= service.engine.admission.in_use <= limit
        await stream.aclose()

    asyncio.run(scenario())
    assert len(made) > 1  # the window let the stream run ahead of its reader
    assert service.engine.admission.in_use == 0  # closed: every unwritten answer's permits are back
