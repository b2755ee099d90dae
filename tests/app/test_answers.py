"""Answers and their timings."""

from __future__ import annotations

import asyncio

from app.answers import Answer, Timings, timed, timings_of
from app.engine.work import ItemResult


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


def _result(batch_started: float, queued_s: float, inference_s: float) -> ItemResult:
    return ItemResult(None, None, queued_s, inference_s, batch_started, 1)


def test_inference_time_counts_each_batch_once_and_queue_time_is_the_longest_wait() -> None:
    results = [_result(1.0, 0.002, 0.010), _result(1.0, 0.004, 0.010), _result(2.0, 0.001, 0.005)]
    t = timings_of(results, tokenization_ms=3.0)
    assert abs(t.inference_ms - 15.0) < 1e-9
    assert abs(t.queue_ms - 4.0) < 1e-9
    assert t.tokenization_ms == 3.0
