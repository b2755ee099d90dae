"""Background's floor in the batch queue: under interactive work that never pauses, background (u=4 … 7)
gets its share of the modelled time in small batches, and its requests finish whole, the oldest first.

Each batcher runs on its own simulated clock (:class:`FakeClock`), moved by each batch's modelled time,
so the share and the order are asserted exactly, and no test sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

import numpy as np

from app.engine.costs import CostModel
from app.engine.pending import Pending, pending_lengths
from app.engine.work import Job, Need, Seq
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock
from tests.app.engine.one_lane import OneLane

LOOP = asyncio.new_event_loop()
# Like a CPU: a batch costs about its tokens, 5 ms a batch, 1 ms a token (seconds).
CPU_LIKE = CostModel(0.005, 0.0, 0.001, 0.0)
# Like a GPU: a batch costs about its launch, 3 ms, and 2 µs a token.
GPU_LIKE = CostModel(0.003, 0.0, 0.000002, 0.0)
# Background requests of eight texts of these lengths, each request in this order.
LENGTHS = (12, 30, 18, 25, 9, 30, 21, 16)


def request(clock: FakeClock, lengths: tuple[int, ...], urgency: int) -> list[Seq]:
    """One job's sequences, as the tokenisation thread queues them."""
    job = Job(LOOP, len(lengths))
    job.urgency = urgency
    need = Need(layers=(1,), pooling="cls")
    return [Seq(np.zeros(n, np.int64), need, job, i, clock.now()) for i, n in enumerate(lengths)]


def batcher(clock: FakeClock, costs: CostModel, share: float = 0.1, size: int = 8) -> OneLane:
    return OneLane(
        max_batch_tokens=10_000,
        max_batch_size=size,
        max_wait_ms=0,
        capacity=10_000,
        metrics=Metrics(),
        clock=clock,
        costs=costs,
        max_queue_delay_ms=100,
        background_share=share,
    )


def saturate(queue: OneLane, clock: FakeClock, costs: CostModel, batches: int) -> list[list[Seq]]:
    """Run ``batches`` batches while interactive work (u=3, length 20) always fills one: each batch takes
    its modelled time on the clock."""
    ran = []
    for _ in range(batches):
        while queue.depth_of(3) < queue.max_batch_size:
            queue.submit(request(clock, (20,), urgency=3))
        batch = queue.next_batch()
        assert batch is not None
        ran.append(batch)
        clock.advance(costs.cost(len(batch), max(s.length for s in batch)))
    return ran


def finished(ran: list[list[Seq]], jobs: list[Job]) -> list[int]:
    """The indices of ``jobs`` whose every sequence ran, in the order their last one ran."""
    left = {id(job): job.count for job in jobs}
    order = []
    for batch in ran:
        for s in batch:
            if id(s.job) in left:
                left[id(s.job)] -= 1
                if left[id(s.job)] == 0:
                    order.append(next(i for i, job in enumerate(jobs) if job is s.job))
    return order


def test_the_floor_gives_background_its_share_of_a_saturated_queue() -> None:
    clock = FakeClock()
    queue = batcher(clock, CPU_LIKE)
    jobs = []
    for _ in range(40):  # far more background than its floor serves in the run
        seqs = request(clock, LENGTHS, urgency=7)
        jobs.append(seqs[0].job)
        queue.submit(seqs)
    ran = saturate(queue, clock, CPU_LIKE, 300)
    total = sum(CPU_LIKE.cost(len(b), max(s.length for s in b)) for b in ran)
    background = np.array([s.length for b in ran for s in b if s.job.urgency == 7], dtype=np.int64)
    worth = float(queue.planner.worth(background).sum())
    # Owed is bounded by one full batch: background's useful work is its share of the time, less that.
    assert worth >= 0.1 * total - queue.planner.full_batch_cost(20)
    assert worth >= 0.09 * total
    assert queue.stats.floor > 0


def test_background_requests_finish_whole_and_the_oldest_first() -> None:
    clock = FakeClock()
    queue = batcher(clock, CPU_LIKE)
    jobs = []
    for _ in range(40):
        seqs = request(clock, LENGTHS, urgency=7)
        jobs.append(seqs[0].job)
        queue.submit(seqs)
    ran = saturate(queue, clock, CPU_LIKE, 300)
    order = finished(ran, jobs)
    assert len(order) >= 15  # at the floor's rate: 10% of ~28 s, a request ~0.165 s of useful work
    assert order == list(range(len(order)))
    started = {id(s.job) for b in ran for s in b if s.job.urgency == 7}
    # A floor batch is the cheapest that holds the oldest: one request after the other, two in progress.
    assert len(started) - len(order) <= 2


def test_a_floor_batch_on_a_cpu_is_a_few_inputs_between_interactive_batches() -> None:
    clock = FakeClock()
    queue = batcher(clock, CPU_LIKE)
    queue.submit(request(clock, LENGTHS * 4, urgency=7))
    ran = saturate(queue, clock, CPU_LIKE, 60)
    floors = [b for b in ran if all(s.job.urgency == 7 for s in b)]
    assert floors and max(len(b) for b in floors) <= 2  # one input is nearly as efficient as eight
    kinds = [b[0].job.urgency for b in ran]
    assert all(not (a == b == 7) for a, b in itertools.pairwise(kinds))  # never two in a row
    full = [i for i, b in enumerate(ran) if b[0].job.urgency == 3]
    assert min(len(ran[i]) for i in full) == 8  # the interactive batches stay whole


def test_a_floor_batch_on_a_gpu_is_full() -> None:
    clock = FakeClock()
    queue = batcher(clock, GPU_LIKE)
    queue.submit(request(clock, (40,) * 32, urgency=7))  # longer than the interactive work: no fill
    ran = saturate(queue, clock, GPU_LIKE, 60)
    floors = [sum(s.job.urgency == 7 for s in b) for b in ran if b[0].job.urgency == 7]
    assert len(floors) == 5 and floors[-1] == 32 - 4 * 7  # one request, in floor batches until done
    assert floors[:-1] == [7] * 4  # a batch costs about its launch: nearly full (one of 8: 8% efficient)


def test_background_rides_along_oldest_first_up_to_the_first_longer_input() -> None:
    clock = FakeClock()
    queue = batcher(clock, GPU_LIKE, size=16)
    first = request(clock, (10, 30, 10, 10), urgency=7)
    second = request(clock, (10,) * 8, urgency=7)
    queue.submit(first)
    queue.submit(second)
    queue.submit(request(clock, (20,), urgency=3))
    batch = queue.next_batch()
    assert batch is not None
    assert batch[1:] == first[:1]  # the 30 is longer than the interactive 20: the fill stops there


def test_a_background_class_is_planned_over_its_front() -> None:
    clock = FakeClock()
    cls = Pending(7)
    seqs = request(clock, (5, 9, 5, 7, 9, 5), urgency=7)
    for s in seqs:
        cls.buckets.setdefault(s.length, deque()).append(s)
    cls.arrivals.extend(seqs)
    cls.depth = len(seqs)
    taken = {id(seqs[0])}  # batched, not yet popped from the arrivals
    lengths, counts = pending_lengths([cls], taken, 3)
    assert lengths.tolist() == [5, 7, 9] and counts.tolist() == [1, 1, 1]  # 9, 5, 7: the three oldest


def test_nothing_is_owed_once_no_background_waits() -> None:
    clock = FakeClock()
    queue = batcher(clock, CPU_LIKE)
    queue.submit(request(clock, (20,), urgency=7))
    saturate(queue, clock, CPU_LIKE, 10)
    assert queue.depth_of(7) == 0 and queue.floor.owed == 0.0
