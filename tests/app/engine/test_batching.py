"""Batch assembly: grouping by length, the padding-charging budget, waiting for company, cancellation, the
queue-delay budget, and urgency (interactive first, background fills, capped and aged).

Each batcher runs on a simulated clock (:class:`FakeClock`): time moves only where a test moves it, or a
wait for company runs to its deadline at once, so every decision that depends on time is asserted exactly.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engine.costs import CostModel
from app.engine.planner import Planner
from app.engine.work import Job, Need, Seq
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock
from tests.app.engine.one_lane import OneLane

LOOP = asyncio.new_event_loop()
# Shared by the tests' batchers: only differences of its times matter, and it only moves forward.
CLOCK = FakeClock()


def item(length: int, job: Job | None = None, age_s: float = 1.0, urgency: int = 3) -> Seq:
    if job is None:
        job = Job(LOOP, 1)
        job.urgency = urgency
    return Seq(
        np.zeros(length, dtype=np.int64),
        Need(layers=(1,), pooling="cls"),
        job,
        0,
        enqueued_at=CLOCK.now() - age_s,  # old enough that no wait applies unless asked
    )


def submit_each(batcher: OneLane, items: list[Seq]) -> None:
    """Queue each item as a job of its own (a submit is one job's sequences)."""
    for i in items:
        batcher.submit([i])


# Like a CPU: a batch costs about its tokens, 5 ms a batch, 1 ms a token (seconds).
CPU_LIKE = CostModel(0.005, 0.0, 0.001, 0.0)
# Like a GPU: a batch costs about its launch, 3 ms, and 2 µs a token.
GPU_LIKE = CostModel(0.003, 0.0, 0.000002, 0.0)


def test_groups_by_length_around_the_oldest() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000, max_batch_size=3, max_wait_ms=0, capacity=100, metrics=Metrics(), clock=CLOCK
    )
    items = [item(n) for n in (50, 10, 52, 11, 49, 12)]
    batcher.submit(items)
    first = batcher.next_batch()
    second = batcher.next_batch()
    assert first is not None and second is not None
    assert sorted(i.length for i in first) == [49, 50, 52]  # the oldest (50) and its nearest lengths
    assert sorted(i.length for i in second) == [10, 11, 12]
    assert batcher.stats.padded_tokens - batcher.stats.real_tokens == (3 + 2 + 0) + (2 + 1 + 0)


def test_budget_charges_padding_and_caps_size() -> None:
    batcher = OneLane(
        max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=100, metrics=Metrics(), clock=CLOCK
    )
    batcher.submit([item(30) for _ in range(5)] + [item(10) for _ in range(20)])
    sizes = []
    while batcher.depth:
        batch = batcher.next_batch()
        assert batch is not None
        assert len(batch) * max(i.length for i in batch) <= 100
        assert len(batch) <= 8
        sizes.append(len(batch))
    assert sum(sizes) == 25 and max(sizes) == 8


def test_an_input_over_the_budget_runs_alone() -> None:
    batcher = OneLane(
        max_batch_tokens=50, max_batch_size=8, max_wait_ms=0, capacity=10, metrics=Metrics(), clock=CLOCK
    )
    batcher.submit([item(128), item(10)])
    batches = [batcher.next_batch(), batcher.next_batch()]
    assert sorted([i.length for i in b] for b in batches if b is not None) == [[10], [128]]


def test_waits_for_company_only_when_the_queue_is_nearly_empty() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=4,
        max_wait_ms=200,
        capacity=10,
        metrics=Metrics(),
        clock=CLOCK,
    )
    batcher.submit([item(5, age_s=0)])
    start = CLOCK.now()
    CLOCK.at(0.05, lambda: batcher.submit([item(6, age_s=0)]))
    batch = batcher.next_batch()  # waits: one item cannot fill a batch of four; its company arrives
    assert batch is not None and sorted(i.length for i in batch) == [5, 6]
    assert batcher.stats.waits == 1
    assert CLOCK.now() == start + 0.2  # two of four cannot fill it either: it ran at the oldest's 200 ms

    batcher.submit([item(5, age_s=0) for _ in range(4)])  # enough work: no wait at all
    batch = batcher.next_batch()
    assert batch is not None and len(batch) == 4
    assert batcher.stats.waits == 1  # the count of batches that waited did not move


def test_the_waiting_scheduler_is_woken_by_an_arrival_only_when_it_may_change_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=3,
        max_wait_ms=200,
        capacity=10,
        metrics=Metrics(),
        clock=CLOCK,
    )
    woken: list[float] = []
    monkeypatch.setattr(batcher.scheduler.cond, "notify_all", lambda: woken.append(CLOCK.now()))
    start = CLOCK.now()
    batcher.submit([item(5, age_s=0)])  # nobody waits: nobody is woken
    CLOCK.at(0.05, lambda: batcher.submit([item(5, age_s=0)]))  # two of three: the answer is the same
    CLOCK.at(0.10, lambda: batcher.submit([item(5, age_s=0)]))  # three of three: a full batch, due now
    batch = batcher.next_batch()
    assert batch is not None and len(batch) == 3
    assert woken == [start + 0.10]
    CLOCK.at(0.05, lambda: batcher.submit([item(5, age_s=0) for _ in range(3)]))  # to the idle scheduler
    assert len(batcher.next_batch() or []) == 3
    assert woken == [start + 0.10, start + 0.15]


def test_cancelled_items_are_dropped_before_a_batch_forms() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000, max_batch_size=8, max_wait_ms=0, capacity=10, metrics=Metrics(), clock=CLOCK
    )
    gone = Job(LOOP, 2)
    batcher.submit([item(5, gone), item(5), item(5, gone)])
    gone.cancel()
    batch = batcher.next_batch()
    assert batch is not None and len(batch) == 1
    assert batcher.stats.dropped_cancelled == 2


def test_a_cancelled_or_failed_jobs_sequences_are_not_queued() -> None:
    """Planned on the tokenisation thread after its request left (or after one of its batches failed):
    the poke that dropped its sequences has been, so queued now they would wait with no permits behind
    them, and could fill the queue past its bound."""
    batcher = OneLane(
        max_batch_tokens=10_000, max_batch_size=8, max_wait_ms=0, capacity=4, metrics=Metrics(), clock=CLOCK
    )
    gone, failed = Job(LOOP, 2), Job(LOOP, 2)
    gone.cancel()
    failed.fail(RuntimeError("one of its batches failed"))
    batcher.submit([item(5, gone), item(5, gone)])
    batcher.submit([item(5, failed), item(5, failed)])
    assert batcher.depth == 0
    batcher.submit([item(5), item(5), item(5), item(5)])  # the whole bound is still free
    assert batcher.depth == 4


def test_queue_is_bounded() -> None:
    batcher = OneLane(
        max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=2, metrics=Metrics(), clock=CLOCK
    )
    batcher.submit([item(5), item(5)])
    try:
        batcher.submit([item(5)])
    except RuntimeError as exc:
        assert "bound" in str(exc)
    else:
        raise AssertionError("the batch queue grew past its bound")


def test_stop_releases_a_waiting_assembler() -> None:
    batcher = OneLane(
        max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=2, metrics=Metrics(), clock=CLOCK
    )
    CLOCK.at(0.05, batcher.stop)
    assert batcher.next_batch() is None


def test_stop_from_another_thread_releases_the_real_wait() -> None:
    # Real time (the default clock): the idle assembler blocks in Condition.wait until stop notifies it.
    batcher = OneLane(max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=2, metrics=Metrics())
    result: list[object] = []
    assembler = threading.Thread(target=lambda: result.append(batcher.next_batch()))
    assembler.start()
    batcher.stop()  # before or during its wait: either way it returns None
    assembler.join(timeout=30)
    assert not assembler.is_alive() and result == [None]


def test_picks_the_most_efficient_window_not_the_oldest() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000, max_batch_size=3, max_wait_ms=0, capacity=100, metrics=Metrics(), clock=CLOCK
    )
    # The oldest (40) has no close neighbours; three 20s make a batch with no padding at all.
    batcher.submit([item(n) for n in (40, 10, 20, 20, 20, 60)])
    first = batcher.next_batch()
    assert first is not None and [i.length for i in first] == [20, 20, 20]
    assert batcher.stats.padded_tokens == batcher.stats.real_tokens


def test_an_item_past_its_budget_is_never_passed_over_again() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=2,
        max_wait_ms=0,
        capacity=1000,
        metrics=Metrics(),
        clock=CLOCK,
        max_queue_delay_ms=40,
    )
    odd = item(97, age_s=0)
    batcher.submit([odd])
    batcher.submit([item(10), item(10)])
    first = batcher.next_batch()  # within its budget, the odd one out is passed over for a perfect pair
    assert first is not None and odd not in first
    CLOCK.advance(0.039)  # still within it
    batcher.submit([item(10), item(10)])
    second = batcher.next_batch()
    assert second is not None and odd not in second
    CLOCK.advance(0.002)  # now past it
    batcher.submit([item(10), item(10)])
    third = batcher.next_batch()
    assert third is not None and odd in third
    assert batcher.stats.overdue == 1


def test_the_derived_budget_is_half_a_full_batch_of_the_mean_length_as_batches_run() -> None:
    batcher = OneLane(
        max_batch_tokens=4096,
        max_batch_size=8,
        max_wait_ms=0,
        capacity=100,
        metrics=Metrics(),
        clock=CLOCK,
        costs=CPU_LIKE,
    )
    assert batcher.budget_s() == pytest.approx(0.5 * CPU_LIKE.cost(8, 32))  # before any batch: length 32
    batcher.submit([item(32) for _ in range(8)])
    assert batcher.next_batch() is not None
    batcher.ran(2 * CPU_LIKE.cost(8, 32))  # the machine runs at half the speed measured
    assert batcher.budget_s() == pytest.approx(
        0.5 * CPU_LIKE.cost(8, 32) * (1 + 0.2)
    )  # learning, 20% a batch
    constant = OneLane(
        max_batch_tokens=4096, max_batch_size=8, max_wait_ms=0, capacity=100, metrics=Metrics(), clock=CLOCK
    )
    assert constant.budget_s() == float("inf")  # tokens, not seconds, until a batch has run


def test_a_short_queue_groups_lengths_on_a_cpu_and_not_on_a_gpu() -> None:
    lengths = [10, 10, 10, 10, 60, 60, 60, 60]
    for costs, expected in ((CPU_LIKE, [[10] * 4, [60] * 4]), (GPU_LIKE, [sorted(lengths)])):
        batcher = OneLane(
            max_batch_tokens=4096,
            max_batch_size=8,
            max_wait_ms=0,
            capacity=100,
            metrics=Metrics(),
            clock=CLOCK,
            costs=costs,
        )
        batcher.submit([item(n) for n in lengths])
        got = []
        while batcher.depth:
            batch = batcher.next_batch()
            assert batch is not None
            got.append(sorted(i.length for i in batch))
        assert sorted(got) == expected, costs


def test_interactive_work_goes_first() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=4,
        max_wait_ms=0,
        capacity=100,
        metrics=Metrics(),
        clock=CLOCK,
        costs=CPU_LIKE,
    )
    background = [item(20, urgency=7) for _ in range(8)]
    batcher.submit(background[:4])
    batcher.submit(background[4:])
    urgent = item(20, urgency=0)
    batcher.submit([urgent])
    first = batcher.next_batch()
    assert first is not None and first[0] is urgent
    assert batcher.stats.by_urgency[0] == 1


def test_background_fills_a_batch_as_far_as_the_budget_allows() -> None:
    # On a GPU-like device a batch costs about its launch: the interactive one takes background along.
    gpu = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=16,
        max_wait_ms=0,
        capacity=100,
        metrics=Metrics(),
        clock=CLOCK,
        costs=GPU_LIKE,
        max_queue_delay_ms=10,
    )
    gpu.submit([item(30, urgency=7, age_s=0) for _ in range(6)] + [item(40, urgency=7, age_s=0)])
    gpu.submit([item(32, age_s=0)])
    batch = gpu.next_batch()
    assert batch is not None and len(batch) == 7  # the interactive one and every background one ≤ 32 long
    assert {i.length for i in batch} == {32, 30} and gpu.stats.filled == 6
    # On a CPU-like device each more costs its tokens: only as many as the oldest's budget pays for.
    cpu = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=16,
        max_wait_ms=0,
        capacity=100,
        metrics=Metrics(),
        clock=CLOCK,
        costs=CPU_LIKE,
        max_queue_delay_ms=100,
    )
    cpu.submit([item(30, urgency=7, age_s=0) for _ in range(6)])
    cpu.submit([item(32, age_s=0)])
    batch = cpu.next_batch()
    assert batch is not None
    assert len(batch) == 1 + 3  # 100 ms of budget, 32 ms for each one more (padded to 32 tokens)


def test_background_batches_are_capped_while_interactive_work_is_about() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=16,
        max_wait_ms=0,
        capacity=100,
        metrics=Metrics(),
        clock=CLOCK,
        costs=CPU_LIKE,
        max_queue_delay_ms=100,
    )
    batcher.submit([item(20, urgency=7) for _ in range(16)])
    alone = batcher.next_batch()
    assert alone is not None and len(alone) == 16  # nobody more urgent seen: a full batch
    batcher.submit([item(20, urgency=7) for _ in range(16)])
    batcher.submit([item(20, age_s=0)])
    assert len(batcher.next_batch() or []) == 1 + 5  # the interactive one, and 5 × 20 ms of fill: 100 ms
    capped = batcher.next_batch()
    assert capped is not None and CPU_LIKE.cost(len(capped), 20) <= 0.100 < CPU_LIKE.cost(len(capped) + 1, 20)
    assert batcher.stats.capped == 1


def test_background_ages_and_never_starves() -> None:
    batcher = OneLane(
        max_batch_tokens=10_000,
        max_batch_size=2,
        max_wait_ms=0,
        capacity=1000,
        metrics=Metrics(),
        clock=CLOCK,
        costs=CPU_LIKE,
        max_queue_delay_ms=1_000,
        urgency_aging_ms=7.8125,  # 2**-7 s, and a step of 2**-9 s: exact in binary
        background_share=0.0,  # aging alone: no floor (test_the_floor_* below)
    )
    waiting = item(20, urgency=7, age_s=0)
    batcher.submit([waiting])
    served_after = None
    for n in range(200):  # interactive work that never pauses
        batcher.submit([item(20, age_s=0), item(20, age_s=0)])
        batch = batcher.next_batch()
        assert batch is not None
        if waiting in batch:
            served_after = n
            break
        CLOCK.advance(2**-9)
    # Four levels from 7 to 3 at 2**-7 s each: 16 interactive batches 2**-9 s apart, then its turn (at the
    # same level as the interactive work, and the oldest).
    assert served_after == 16
    assert batcher.stats.aged == 1
    assert batcher.stats.capped == 1  # its batch was held to the budget: interactive work was about


def _window_score(
    ordered: list[int], ends: np.ndarray, lengths: np.ndarray, top: int, k: int, planner: Planner
) -> float:
    """Useful work per cost of the window of ``k`` sequences ending at run ``top`` of the sorted queue."""
    window = ordered[int(ends[top]) - k : int(ends[top])]
    worth = sum(float(planner.worth(np.array([n]))[0]) for n in window)
    return worth / planner.model.cost(k, int(lengths[top]))


@pytest.mark.parametrize(
    "model", [CostModel.constant(16), CPU_LIKE, GPU_LIKE, CostModel(0.004, 1e-4, 8e-4, 2e-6)]
)
def test_the_planner_finds_the_best_window_a_brute_force_search_finds(model: CostModel) -> None:
    """Every (top length, size) window of the length-sorted queue, in plain Python, against the numpy plan:
    the same best useful work per cost, with and without an anchor and a cap, for batch sizes 1 to 256."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        size, budget = int(rng.choice([1, 3, 8, 256])), int(rng.choice([64, 512, 4096]))
        lengths = np.unique(rng.integers(3, 60, int(rng.integers(1, 12)))).astype(np.int64)
        counts = rng.integers(1, 9, len(lengths)).astype(np.int64)
        anchor = None if rng.random() < 0.6 else int(rng.integers(0, len(lengths)))
        cap = None if rng.random() < 0.7 else float(model.cost(int(rng.integers(1, 9)), int(lengths[-1])))
        planner = Planner(model, size, budget)
        ordered = [int(n) for n, c in zip(lengths, counts, strict=True) for _ in range(int(c))]
        ends = np.cumsum(counts)
        allowed = [
            (top, k)
            for top in range(len(lengths))
            for k in range(1, min(size, int(ends[top])) + 1)
            if (k * int(lengths[top]) <= budget or k == 1)
            and (cap is None or model.cost(k, int(lengths[top])) <= cap or k == 1)
            and (anchor is None or (top >= anchor and int(ends[top]) - k < int(ends[anchor])))
        ]
        window = planner.choose(lengths, counts, anchor, cap)
        assert (window.top, window.size) in allowed
        assert window.cost == pytest.approx(model.cost(window.size, int(lengths[window.top])))
        best = max(_window_score(ordered, ends, lengths, t, k, planner) for t, k in allowed)
        got = _window_score(ordered, ends, lengths, window.top, window.size, planner)
        assert got == pytest.approx(best), (size, budget, lengths, counts, anchor, cap)
