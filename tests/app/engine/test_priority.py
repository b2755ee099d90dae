"""Urgency in the engine: the admission share of each level, and a job takes its request's urgency."""

from __future__ import annotations

import asyncio

from app.engine.priority import DEFAULT_URGENCY, URGENCY, admission_limit
from app.engine.work import Job


def test_less_urgent_requests_may_fill_less_of_the_one_budget() -> None:
    assert [admission_limit(512, u) for u in range(8)] == [512, 512, 512, 512, 448, 384, 320, 256]
    assert admission_limit(1, 7) == 1  # never none at all


def test_a_job_takes_the_urgency_of_the_task_that_creates_it() -> None:
    async def make(urgency: int | None) -> Job:
        if urgency is not None:
            URGENCY.set(urgency)
        return Job(asyncio.get_running_loop(), 1)

    assert asyncio.run(make(None)).urgency == DEFAULT_URGENCY
    assert asyncio.run(make(7)).urgency == 7
    assert URGENCY.get() == DEFAULT_URGENCY  # set inside a task: nothing leaks out of it
