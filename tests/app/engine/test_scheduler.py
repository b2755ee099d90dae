"""One inference thread for several models' queues: which model's batch runs next (by urgency after
aging, then an overdue input, then the most useful work per modelled second), waiting for company as one
queue does, holding less urgent batches to their budget while another model has urgent work, and
serving each batch on its own model's inference stage; and the express thread, which runs another
model's short batch beside the inference thread's long one.

Every queue runs on one simulated clock (:class:`FakeClock`): each decision is asserted exactly, and no
test sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from app.engine.batching import Batcher
from app.engine.costs import CostModel
from app.engine.scheduler import Scheduler
from app.engine.work import Job, Need, Seq
from app.errors import Unavailable
from app.telemetry.metrics import Metrics
from tests.app.conftest import wait_until
from tests.app.engine.fake_clock import FakeClock

LOOP = asyncio.new_event_loop()
# Like a CPU: a batch costs about its tokens, 5 ms a batch, 1 ms a token (seconds).
CPU_LIKE = CostModel(0.005, 0.0, 0.001, 0.0)


class Served:
    """What a lane's inference stage was handed (the scheduler calls ``serve`` and reads ``calibrate``)."""

    def __init__(self) -> None:
        self.batches: list[list[Seq]] = []
        self.calibrate = None
        self.fault: str | None = None

    def serve(self, batch: list[Seq], trimmer: Any = None) -> None:
        self.batches.append(batch)


def two(
    clock: FakeClock,
    max_wait_ms: float = 0.0,
    max_queue_delay_ms: float | None = 1000.0,
    aging_ms: float = 1000.0,
    size: int = 8,
    express_share: float = 0.0,
) -> tuple[Scheduler, dict[str, Batcher], dict[str, Served]]:
    """A scheduler over two models' queues, ``a`` and ``b``, on ``clock``."""
    scheduler = Scheduler(clock, express_share=express_share)
    batchers, served = {}, {}
    for name in ("a", "b"):
        batchers[name] = Batcher(
            max_batch_tokens=10_000,
            max_batch_size=size,
            max_wait_ms=max_wait_ms,
            capacity=1000,
            metrics=Metrics(),
            costs=CPU_LIKE,
            max_queue_delay_ms=max_queue_delay_ms,
            urgency_aging_ms=aging_ms,
            clock=clock,
            cond=scheduler.cond,
        )
        served[name] = Served()
        scheduler.add(name, batchers[name], served[name])  # type: ignore[arg-type]
    return scheduler, batchers, served


def seq(clock: FakeClock, length: int, urgency: int = 3, age_s: float = 0.0) -> Seq:
    job = Job(LOOP, 1)
    job.urgency = urgency
    return Seq(np.zeros(length, np.int64), Need(layers=(1,), pooling="cls"), job, 0, clock.now() - age_s)


def each(batcher: Batcher, items: list[Seq]) -> None:
    for s in items:
        batcher.submit([s])


def picked(scheduler: Scheduler) -> tuple[str, int]:
    """The lane whose batch runs next, and its size."""
    got = scheduler.next_batch()
    assert got is not None
    lane, batch = got
    return lane.name, len(batch)


def test_the_most_urgent_model_runs_first_whichever_was_queued_first() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock)
    each(q["a"], [seq(clock, 10, urgency=7, age_s=0.5) for _ in range(8)])  # background, older, full
    each(q["b"], [seq(clock, 10, urgency=3)])  # interactive, one input
    assert picked(scheduler) == ("b", 1)
    assert picked(scheduler)[0] == "a"


def test_at_one_urgency_the_batch_with_the_most_useful_work_per_second_runs() -> None:
    """a's queue holds lengths that pad badly together (useful share ~0.5); b's, one length (share ~1)."""
    clock = FakeClock()
    scheduler, q, _ = two(clock, size=2)
    each(q["a"], [seq(clock, 100, age_s=0.01), seq(clock, 4, age_s=0.01)])  # older
    each(q["b"], [seq(clock, 50), seq(clock, 50)])
    a = q["a"].offer(clock.now())
    b = q["b"].offer(clock.now())
    assert a is not None and b is not None and b.window.efficiency > a.window.efficiency
    assert picked(scheduler) == ("b", 2)


def test_an_overdue_input_runs_before_a_more_efficient_batch() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, size=2, max_queue_delay_ms=50)
    each(q["a"], [seq(clock, 100, age_s=0.06), seq(clock, 4, age_s=0.06)])  # past its 50 ms budget
    each(q["b"], [seq(clock, 50), seq(clock, 50)])
    assert picked(scheduler)[0] == "a"


def test_of_overdue_batches_the_one_furthest_past_its_own_models_budget_runs_first() -> None:
    """Under load every input is past its budget; oldest-first would serve the models in lock-step, a
    cheap model's request waiting for every older input of the expensive one."""
    clock = FakeClock()
    scheduler, q, _ = two(clock, size=8, max_queue_delay_ms=50)
    q["b"].max_queue_delay_s = 0.002  # a cheap model: its budget is 2 ms
    each(q["a"], [seq(clock, 20, age_s=0.080) for _ in range(8)])  # 1.6 of its budgets past
    q["b"].submit([seq(clock, 20, age_s=0.010)])  # younger, but 5 of its budgets past
    assert picked(scheduler) == ("b", 1)
    assert picked(scheduler) == ("a", 8)


def test_background_work_of_one_model_ages_past_another_models_interactive_flood() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, size=2, aging_ms=7.8125)  # 2**-7 s a level: exact in binary
    waiting = seq(clock, 20, urgency=7)
    q["a"].submit([waiting])
    served_after = None
    for n in range(200):  # the other model's interactive work never pauses
        each(q["b"], [seq(clock, 20), seq(clock, 20)])
        got = scheduler.next_batch()
        assert got is not None
        if waiting in got[1]:
            served_after = n
            break
        clock.advance(2**-9)
    # Four levels from 7 to 3, 2**-7 s each, take 16 of b's batches 2**-9 s apart; at b's level b's full
    # batches do more useful work per second than a's one input, so a's turn comes one level later, once
    # aged past b (or once past its queue-delay budget, had that come first): after 20.
    assert served_after == 20


def test_a_less_urgent_batch_is_held_to_its_budget_while_another_model_has_urgent_work() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, size=64, max_queue_delay_ms=100)
    each(q["a"], [seq(clock, 20, urgency=7, age_s=0.001) for _ in range(40)])
    alone = picked(scheduler)
    assert alone == ("a", 40)  # nobody more urgent about: the whole queue in one batch
    each(q["a"], [seq(clock, 20, urgency=7, age_s=0.001) for _ in range(40)])
    q["b"].submit([seq(clock, 20)])  # interactive work on the OTHER model
    assert picked(scheduler) == ("b", 1)
    name, size = picked(scheduler)
    assert name == "a" and CPU_LIKE.cost(size, 20) <= 0.100 < CPU_LIKE.cost(size + 1, 20)
    assert q["a"].stats.capped == 1


def test_the_thread_waits_for_company_of_the_most_urgent_model_not_for_a_less_urgent_one() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, max_wait_ms=2.0)
    q["a"].company_expected = lambda: True  # more inputs of a's are being tokenised
    q["a"].submit([seq(clock, 10)])
    each(q["b"], [seq(clock, 10, urgency=7, age_s=0.5) for _ in range(8)])  # full, but background
    start = clock.now()
    clock.at(0.001, lambda: q["a"].submit([seq(clock, 10)]))  # a's company arrives within the wait
    assert picked(scheduler) == ("a", 2)
    assert clock.now() - start == pytest.approx(0.002)  # waited its max_wait_ms, not less
    assert q["a"].stats.waits == 1
    assert picked(scheduler)[0] == "b"


def test_an_idle_scheduler_wakes_on_any_models_arrival_and_stops_on_stop() -> None:
    scheduler, q, _ = two(FakeClock())
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(scheduler.next_batch()))
    thread.start()
    q["b"].submit([seq(FakeClock(), 10)])  # from another thread, as the tokeniser submits
    thread.join(timeout=30)
    assert not thread.is_alive() and got[0][0].name == "b"
    waiting = threading.Thread(target=lambda: got.append(scheduler.next_batch()))
    waiting.start()
    scheduler.stop()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and got[1] is None


def test_the_thread_serves_each_batch_on_its_own_models_stage() -> None:
    scheduler, q, served = two(FakeClock())
    q["a"].submit([seq(FakeClock(), 10)])
    q["b"].submit([seq(FakeClock(), 12), seq(FakeClock(), 12)])
    calibrated: list[str] = []
    served["a"].calibrate = lambda: calibrated.append("a")  # type: ignore[assignment]
    served["b"].calibrate = lambda: calibrated.append("b")  # type: ignore[assignment]
    scheduler.start()
    wait_until(lambda: bool(served["a"].batches and served["b"].batches))
    scheduler.stop()
    assert calibrated == ["a", "b"]  # each model's cost model first, in order
    assert [len(b) for b in served["a"].batches] == [1] and [len(b) for b in served["b"].batches] == [2]
    assert {lane.name: lane.batches for lane in scheduler.lanes} == {"a": 1, "b": 1}


def test_a_queue_on_another_condition_is_refused() -> None:
    scheduler = Scheduler(FakeClock())
    alone = Batcher(100, 8, 0.0, 10, Metrics(), clock=scheduler.clock)
    with pytest.raises(ValueError, match="share the scheduler's condition"):
        scheduler.add("x", alone, Served())  # type: ignore[arg-type]


def express(scheduler: Scheduler, k: int = 1) -> tuple[str, int]:
    """The lane whose batch express thread ``k`` runs next, and its size."""
    got = scheduler.next_batch(k)
    assert got is not None
    lane, batch = got
    return lane.name, len(batch)


def blocked(scheduler: Scheduler, step: Any) -> list[Any]:
    """What ``step`` (an express thread's ``next_batch``) returned on a thread of its own, once it waited with nothing to
    run and the scheduler was then stopped: ``[None]``."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(step()))
    thread.start()
    wait_until(lambda: scheduler.waiting == 1 or not thread.is_alive())
    scheduler.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return got


def test_a_short_batch_of_another_model_runs_beside_a_long_one() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    each(q["a"], [seq(clock, 100) for _ in range(8)])  # 0.805 s by CPU_LIKE
    assert picked(scheduler) == ("a", 8)  # on the inference thread
    q["b"].submit([seq(clock, 10)])  # 0.015 s: within a quarter of a's batch
    assert express(scheduler) == ("b", 1)
    assert [lane.batches for lane in scheduler.lanes] == [1, 1]
    assert (q["a"].stats.beside, q["b"].stats.beside) == (0, 1)


def test_nothing_runs_beside_a_batch_it_would_take_over_the_share_of() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    each(q["a"], [seq(clock, 10) for _ in range(8)])  # 0.085 s
    assert picked(scheduler) == ("a", 8)
    each(q["b"], [seq(clock, 30) for _ in range(2)])  # 0.065 s: over a quarter of 0.085
    assert blocked(scheduler, lambda: scheduler.next_batch(1)) == [None]
    assert q["b"].depth == 2  # still queued, for the inference thread


def test_nothing_runs_beside_an_idle_inference_thread_or_with_no_share() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    q["b"].submit([seq(clock, 10)])
    assert blocked(scheduler, lambda: scheduler.next_batch(1)) == [None]  # the inference thread takes it
    assert q["b"].depth == 1
    scheduler, q, _ = two(clock)  # express_share 0
    each(q["a"], [seq(clock, 100) for _ in range(8)])
    assert picked(scheduler) == ("a", 8)
    q["b"].submit([seq(clock, 10)])
    assert blocked(scheduler, lambda: scheduler.next_batch(1)) == [None]


def test_a_less_urgent_batch_does_not_run_beside_a_more_urgent_one() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    each(q["a"], [seq(clock, 100) for _ in range(8)])
    assert picked(scheduler) == ("a", 8)
    q["b"].submit([seq(clock, 10, urgency=7)])
    assert blocked(scheduler, lambda: scheduler.next_batch(1)) == [None]
    assert q["b"].depth == 1


def test_a_model_runs_on_one_thread_at_a_time() -> None:
    """While the express thread runs b's batch, the inference thread passes over b's newer inputs; once
    the express thread asks for its next batch, b's is free for either thread again."""
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    each(q["a"], [seq(clock, 100) for _ in range(16)])
    assert picked(scheduler) == ("a", 8)
    q["b"].submit([seq(clock, 10)])
    assert express(scheduler) == ("b", 1)
    q["b"].submit([seq(clock, 10, age_s=1.0)])  # past its budget: the inference thread would take it
    assert picked(scheduler) == ("a", 8)
    assert express(scheduler) == ("b", 1)  # b's first batch done: its next runs beside a's second


def test_each_other_model_may_run_beside_the_long_batch_on_an_express_thread_of_its_own() -> None:
    clock = FakeClock()
    scheduler, q, _ = two(clock, express_share=0.25)
    c = Batcher(10_000, 8, 0.0, 1000, Metrics(), costs=CPU_LIKE, clock=clock, cond=scheduler.cond)
    scheduler.add("c", c, Served())  # type: ignore[arg-type]
    each(q["a"], [seq(clock, 100) for _ in range(8)])
    assert picked(scheduler) == ("a", 8)
    q["b"].submit([seq(clock, 10)])
    c.submit([seq(clock, 12)])
    assert {express(scheduler, 1), express(scheduler, 2)} == {("b", 1), ("c", 1)}
    scheduler.start()  # and it starts one express thread per model but one
    scheduler.stop()
    assert scheduler.express_threads == 2


class Killed(BaseException):
    """What no ``except Exception`` catches: the thread dies of it."""


class Dies(Served):
    def serve(self, batch: list[Seq], trimmer: Any = None) -> None:
        raise Killed()


def test_a_dead_thread_marks_every_model_and_answers_what_its_queues_hold_503() -> None:
    scheduler, q, _ = two(FakeClock())
    for lane in scheduler.lanes:
        lane.inference = Dies()  # type: ignore[assignment]
    held, queued = seq(FakeClock(), 10), seq(FakeClock(), 12)
    q["a"].submit([held])
    q["b"].submit([queued])
    scheduler.start()
    wait_until(lambda: q["a"].depth == q["b"].depth == 0)
    later = seq(FakeClock(), 8)
    q["b"].submit([later])  # after the death: refused too, not left waiting
    wait_until(lambda: q["b"].depth == 0)
    scheduler.stop()
    LOOP.run_until_complete(asyncio.sleep(0))  # the jobs' failures, handed to their loop
    for item in (held, queued, later):
        assert isinstance(item.job.error, Unavailable) and "Killed" in item.job.error.message
    assert all(lane.inference.fault == "the inference thread stopped: Killed" for lane in scheduler.lanes)


def test_the_background_floor_holds_per_model_beside_another_models_interactive_work() -> None:
    """a's background beside a's interactive work gets its floor of a's modelled time, at the level of
    the work it goes before, while b's interactive flood takes its turns too."""
    clock = FakeClock()
    scheduler, q, _ = two(clock, max_queue_delay_ms=100)
    each(q["a"], [seq(clock, 20, urgency=7) for _ in range(200)])
    a_cost = a_worth = 0.0
    for _ in range(200):
        for name in ("a", "b"):  # interactive work on both models that never pauses
            while q[name].depth_of(3) < 8:
                q[name].submit([seq(clock, 20)])
        got = scheduler.next_batch()
        assert got is not None
        lane, batch = got
        cost = CPU_LIKE.cost(len(batch), max(s.length for s in batch))
        clock.advance(cost)
        if lane.name == "a":
            a_cost += cost
            mine = np.array([s.length for s in batch if s.job.urgency == 7], dtype=np.int64)
            a_worth += float(q["a"].planner.worth(mine).sum()) if len(mine) else 0.0
    assert q["a"].stats.floor > 0 and q["b"].stats.floor == 0
    assert a_worth >= 0.1 * a_cost - q["a"].planner.full_batch_cost(20)
