"""Jobs and sequences: one wake-up per job, cancellation, failure from any thread."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest

from app.engine.work import Job, Need, Seq


def test_a_job_resolves_once_its_last_sequence_is_done() -> None:
    async def scenario() -> Job:
        job = Job(asyncio.get_running_loop(), 3)
        threading.Thread(target=job.finish, args=(2,)).start()
        await asyncio.sleep(0.05)
        assert not job.future.done()  # one sequence is still out
        threading.Thread(target=job.finish, args=(1,)).start()
        await asyncio.wait_for(job.future, 5)
        return job

    job = asyncio.run(scenario())
    assert job.remaining == 0


def jobs_left(scenario: Coroutine[Any, Any, None], ours: object) -> list[Job]:
    """The jobs whose context is ``ours`` still alive after ``scenario``, with the cycle collector off."""
    gc.collect()
    gc.disable()
    try:
        asyncio.run(scenario)
        return [o for o in gc.get_objects() if isinstance(o, Job) and o.context is ours]
    finally:
        gc.enable()


def test_a_finished_job_is_freed_by_reference_counting_not_left_to_the_cycle_collector() -> None:
    """A job in a reference cycle (its future holding it as the result) outlives its request until a full
    collection, with its result arrays: a worker grew ~2.5 MB a minute by that (docs/performance.md)."""

    ours = object()  # other tests' jobs may still be about: count this one only

    async def scenario() -> None:
        job = Job(asyncio.get_running_loop(), 1)
        job.context = ours
        job.vectors = np.zeros((4, 1, 768), np.float32)
        job.finish(1)
        await job.future

    assert jobs_left(scenario(), ours) == []


def test_a_failed_job_is_freed_by_reference_counting_not_left_to_the_cycle_collector() -> None:
    """A refused request (a 4xx raised while its job is planned) leaves no cycle: the exception's traceback
    holds frames that hold the job, so the job must not hold the exception once it is raised."""

    ours = object()

    def plan(job: Job) -> None:  # a frame holding the job, on the exception's traceback
        try:
            raise ValueError("too long")
        except ValueError as exc:
            job.fail(exc)

    async def request() -> None:
        job = Job(asyncio.get_running_loop(), 0)
        job.context = ours
        job.vectors = np.zeros((4, 1, 768), np.float32)
        plan(job)
        await job.future
        job.raise_error()

    async def scenario() -> None:
        with pytest.raises(ValueError, match="too long"):
            await request()

    assert jobs_left(scenario(), ours) == []


def test_failure_from_another_thread_and_late_results_are_ignored() -> None:
    async def scenario() -> None:
        job = Job(asyncio.get_running_loop(), 1)
        threading.Thread(target=job.fail, args=(RuntimeError("boom"),)).start()
        await asyncio.wait_for(job.future, 5)
        with pytest.raises(RuntimeError, match="boom"):
            job.raise_error()
        job.raise_error()  # raised once: the job lets go of it
        job.finish(1)  # a late result after the failure is ignored, not an InvalidStateError
        await asyncio.sleep(0.01)

    asyncio.run(scenario())


def test_a_sequence_knows_its_job_slot_and_length() -> None:
    loop = asyncio.new_event_loop()
    try:
        job = Job(loop, 2)
        seq = Seq(np.arange(5), Need(layers=(1,)), job, 1, 7.0)
        assert (seq.length, seq.slot, seq.job) == (5, 1, job) and seq.enqueued_at == 7.0
        assert not job.cancelled
        job.cancel()
        assert seq.job.cancelled
    finally:
        loop.close()


def test_a_sequence_keeps_an_enqueued_at_of_zero() -> None:
    # A simulated clock starts at 0.0: that is when the sequence was queued, not "now" in real time.
    loop = asyncio.new_event_loop()
    try:
        job = Job(loop, 1)
        assert Seq(np.arange(3), Need(layers=(1,)), job, 0, 0.0).enqueued_at == 0.0
    finally:
        loop.close()
