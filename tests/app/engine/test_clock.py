"""The batch queue reads every time it compares from the clock it is handed: a simulated one that starts
at zero too (zero is a time like any other, never "not set")."""

from __future__ import annotations

import asyncio

import numpy as np

from app.engine.work import Job, Need, Seq
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock
from tests.app.engine.one_lane import OneLane

LOOP = asyncio.new_event_loop()


def test_a_batch_waits_for_company_from_an_arrival_at_zero() -> None:
    clock = FakeClock(0.0)
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=4,
        max_wait_ms=200,
        capacity=10,
        metrics=Metrics(),
        clock=clock,
    )
    job = Job(LOOP, 1)
    batcher.submit([Seq(np.zeros(5, np.int64), Need(layers=(1,), pooling="cls"), job, 0, clock.now())])
    batch = batcher.next_batch()  # alone, it waits for company: 200 ms from its arrival at 0.0
    assert batch is not None and len(batch) == 1
    assert clock.now() == 0.2
