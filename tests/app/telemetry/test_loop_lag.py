"""The event loop's lag: how much later than asked the monitor's sleep wakes, on a fake clock."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.telemetry.loop_lag import LoopLag
from tests.app.conftest import metric, wait_until


class FakeLoop:
    """A clock and a sleep that advances it by the sleep asked for plus ``late`` (a callback's hold)."""

    def __init__(self, late: list[float]) -> None:
        self.now = 100.0
        self.late = late

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late.pop(0)


def measured(late: list[float], interval_s: float = 0.05) -> list[float]:
    fake = FakeLoop(list(late))
    seen: list[float] = []
    monitor = LoopLag(seen.append, interval_s, clock=fake.clock, sleep=fake.sleep)

    async def ticks() -> None:
        for _ in late:
            await monitor.tick()

    asyncio.run(ticks())
    return seen


def test_a_wake_up_held_by_other_work_reports_how_late_it_was() -> None:
    assert measured([0.0, 3.2, 0.004]) == pytest.approx([0.0, 3.2, 0.004])


def test_a_wake_up_never_reports_a_negative_lag() -> None:
    assert measured([-0.01]) == [0.0]  # a clock that reads early is not a loop ahead of time


def test_each_worker_reports_its_loop_lag(client: httpx.Client) -> None:
    # Started with the app's lifespan: samples come in without any request.
    wait_until(lambda: metric(client, "zhembed_event_loop_lag_seconds_count") >= 2)
