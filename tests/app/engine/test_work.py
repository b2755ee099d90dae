"""Work items: tickets cancel, results reach the awaiting coroutine from any thread."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engine.work import ItemResult, Need, Ticket, WorkItem


def _result() -> ItemResult:
    return ItemResult(np.zeros((1, 2), np.float32), None, 0.0, 0.0, 0.0, 1)


def test_a_ticket_cancels_once_for_all() -> None:
    ticket = Ticket()
    assert not ticket.cancelled
    ticket.cancel()
    ticket.cancel()
    assert ticket.cancelled


def test_resolve_and_fail_from_another_thread() -> None:
    async def scenario() -> tuple[ItemResult, BaseException | None]:
        loop = asyncio.get_running_loop()
        ok = WorkItem(np.arange(4), Need(layers=(1,)), Ticket(), loop, loop.create_future())
        bad = WorkItem(np.arange(3), Need(layers=(1,)), Ticket(), loop, loop.create_future())
        assert ok.length == 4
        result = _result()
        threading.Thread(target=ok.resolve, args=(result,)).start()
        threading.Thread(target=bad.fail, args=(RuntimeError("boom"),)).start()
        got = await ok.future
        with pytest.raises(RuntimeError, match="boom"):
            await bad.future
        ok.resolve(_result())  # a second answer is ignored, not an InvalidStateError
        await asyncio.sleep(0.01)
        return got, None

    got, _ = asyncio.run(scenario())
    assert got.batch_size == 1
