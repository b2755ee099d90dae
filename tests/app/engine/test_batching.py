"""Batch assembly: grouping by length, the padding-charging budget, waiting for company, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from app.engine.batching import MAX_PASSED_OVER, Batcher
from app.engine.work import Job, Need, Sequence
from app.telemetry.metrics import Metrics

LOOP = asyncio.new_event_loop()


def item(length: int, job: Job | None = None, age_s: float = 1.0) -> Sequence:
    return Sequence(
        np.zeros(length, dtype=np.int64),
        Need(layers=(1,), pooling="cls"),
        job or Job(LOOP, 1),
        0,
        enqueued_at=time.perf_counter() - age_s,  # old enough that no wait applies unless asked
    )


def test_groups_by_length_around_the_oldest() -> None:
    batcher = Batcher(
        max_batch_tokens=10_000, max_batch_size=3, max_wait_ms=0, capacity=100, metrics=Metrics()
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
    batcher = Batcher(max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=100, metrics=Metrics())
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
    batcher = Batcher(max_batch_tokens=50, max_batch_size=8, max_wait_ms=0, capacity=10, metrics=Metrics())
    batcher.submit([item(128), item(10)])
    batches = [batcher.next_batch(), batcher.next_batch()]
    assert sorted([i.length for i in b] for b in batches if b is not None) == [[10], [128]]


def test_waits_for_company_only_when_the_queue_is_nearly_empty() -> None:
    batcher = Batcher(
        max_batch_tokens=10_000, max_batch_size=4, max_wait_ms=200, capacity=10, metrics=Metrics()
    )
    batcher.submit([item(5, age_s=0)])
    threading.Timer(0.05, lambda: batcher.submit([item(6, age_s=0)])).start()
    batch = batcher.next_batch()  # waits: one item cannot fill a batch of four; its company arrives
    assert batch is not None and len(batch) == 2
    assert batcher.stats.waits == 1

    batcher.submit([item(5, age_s=0) for _ in range(4)])  # enough work: no wait at all
    batch = batcher.next_batch()
    assert batch is not None and len(batch) == 4
    assert batcher.stats.waits == 1  # the count of batches that waited did not move


def test_cancelled_items_are_dropped_before_a_batch_forms() -> None:
    batcher = Batcher(
        max_batch_tokens=10_000, max_batch_size=8, max_wait_ms=0, capacity=10, metrics=Metrics()
    )
    gone = Job(LOOP, 2)
    batcher.submit([item(5, gone), item(5), item(5, gone)])
    gone.cancel()
    batch = batcher.next_batch()
    assert batch is not None and len(batch) == 1
    assert batcher.stats.dropped_cancelled == 2


def test_queue_is_bounded() -> None:
    batcher = Batcher(max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=2, metrics=Metrics())
    batcher.submit([item(5), item(5)])
    try:
        batcher.submit([item(5)])
    except RuntimeError as exc:
        assert "bound" in str(exc)
    else:
        raise AssertionError("the batch queue grew past its bound")


def test_stop_releases_a_waiting_assembler() -> None:
    batcher = Batcher(max_batch_tokens=100, max_batch_size=8, max_wait_ms=0, capacity=2, metrics=Metrics())
    threading.Timer(0.05, batcher.stop).start()
    assert batcher.next_batch() is None


def test_picks_the_most_efficient_window_not_the_oldest() -> None:
    batcher = Batcher(
        max_batch_tokens=10_000, max_batch_size=3, max_wait_ms=0, capacity=100, metrics=Metrics()
    )
    # The oldest (40) has no close neighbours; three 20s make a batch with no padding at all.
    batcher.submit([item(n) for n in (40, 10, 20, 20, 20, 60)])
    first = batcher.next_batch()
    assert first is not None and [i.length for i in first] == [20, 20, 20]
    assert batcher.stats.padded_tokens == batcher.stats.real_tokens


def test_an_item_passed_over_is_run_within_a_bounded_number_of_batches() -> None:
    batcher = Batcher(
        max_batch_tokens=10_000, max_batch_size=2, max_wait_ms=0, capacity=1000, metrics=Metrics()
    )
    odd = item(97)
    batcher.submit([odd])
    ran_after = None
    for n in range(40):
        # A steady stream of perfectly fitting pairs that would always beat the odd one out.
        batcher.submit([item(10), item(10)])
        batch = batcher.next_batch()
        assert batch is not None
        if any(i is odd for i in batch):
            ran_after = n
            break
    assert ran_after is not None and ran_after <= MAX_PASSED_OVER + 1


def _efficiency(
    ordered: list[int], ends: np.ndarray, lengths: np.ndarray, top: int, k: int, overhead: int
) -> float:
    """Useful tokens per cost of the window of ``k`` sequences ending at run ``top`` of the sorted queue."""
    window = ordered[int(ends[top]) - k : int(ends[top])]
    return sum(window) / (k * int(lengths[top]) + overhead)


def test_the_planner_finds_the_most_efficient_window_a_brute_force_search_finds() -> None:
    """Every (top length, size) window of the length-sorted queue, in plain Python, against the numpy plan:
    the same best useful-tokens-per-cost, with and without an anchor, for batch sizes 1 to 256."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        size, budget = int(rng.choice([1, 3, 8, 256])), int(rng.choice([64, 512, 4096]))
        lengths = np.unique(rng.integers(3, 60, int(rng.integers(1, 12)))).astype(np.int64)
        counts = rng.integers(1, 9, len(lengths)).astype(np.int64)
        anchor = None if rng.random() < 0.6 else int(rng.integers(0, len(lengths)))
        batcher = Batcher(
            max_batch_tokens=budget, max_batch_size=size, max_wait_ms=0, capacity=10_000, metrics=Metrics()
        )
        ordered = [int(n) for n, c in zip(lengths, counts, strict=True) for _ in range(int(c))]
        ends = np.cumsum(counts)
        overhead = batcher.overhead_tokens
        best = max(
            _efficiency(ordered, ends, lengths, top, k, overhead)
            for top in range(len(lengths))
            for k in range(1, min(size, int(ends[top])) + 1)
            if (k * int(lengths[top]) <= budget or k == 1)
            and (anchor is None or (top >= anchor and int(ends[top]) - k < int(ends[anchor])))
        )
        top, k = batcher._most_efficient_window(lengths, counts, anchor)
        got = _efficiency(ordered, ends, lengths, top, k, overhead)
        assert got == pytest.approx(best), (size, budget, lengths, counts, anchor)
