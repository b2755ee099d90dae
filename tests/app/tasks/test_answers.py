"""Answers and their timings."""

from __future__ import annotations

import asyncio

from app.engine.work import Job
from app.tasks.answers import Answer, timed, timings_of
from app.telemetry.timings import Timings


class _Endpoint:
    @timed
    async def slow(self, seconds: float) -> Answer[str]:
        await asyncio.sleep(seconds)
        return Answer("done", Timings(queue_ms=1.0))


def test_timed_sets_the_total_and_keeps_the_rest() -> None:
    answer = asyncio.run(_Endpoint().slow(0.02))
    assert answer.value == "done"
    assert answer.timings.queue_ms == 1.0
    assert answer.timings.total_ms >= 20.0


def _job(queued_s: float, batches: dict[float, float]) -> Job:
    job = Job(asyncio.new_event_loop(), 1)
    job.queued_s, job.batches = queued_s, batches
    return job


def test_inference_time_counts_each_batch_once_and_queue_time_is_the_longest_wait() -> None:
    jobs = [_job(0.002, {1.0: 0.010}), _job(0.004, {1.0: 0.010, 2.0: 0.005})]
    t = timings_of(jobs, tokenization_ms=3.0)
    assert abs(t.inference_ms - 15.0) < 1e-9
    assert abs(t.queue_ms - 4.0) < 1e-9
    assert t.tokenization_ms == 3.0
