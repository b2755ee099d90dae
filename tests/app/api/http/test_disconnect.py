"""A client that leaves cancels its request's work."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.types import Message

from app.api.http.disconnect import unless_disconnected
from app.errors import ClientGone


def test_work_is_cancelled_when_the_client_leaves() -> None:
    async def main() -> bool:
        async def receive() -> Message:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        cancelled = asyncio.Event()

        async def work() -> int:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 1

        with pytest.raises(ClientGone):
            await unless_disconnected(request, work())
        await asyncio.sleep(0)
        return cancelled.is_set()

    assert asyncio.run(main())


def test_result_comes_back_when_the_client_stays() -> None:
    async def main() -> int:
        async def receive() -> Message:
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

        async def work() -> int:
            return 7

        return await unless_disconnected(Request({"type": "http", "headers": []}, receive), work())

    assert asyncio.run(main()) == 7
