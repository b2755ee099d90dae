"""What the batch queue (:mod:`app.engine.batching`) holds: the pending sequences of each urgency, how a
planned batch and its fill are taken out of them, the batch it offers, and the assembler's counters."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from app.engine.planner import Window
from app.engine.priority import BACKGROUND, URGENCIES
from app.engine.work import Seq
from app.errors import InternalError

# A background class is planned over its oldest inputs, this many full batches' worth (at most FRONT_MOST):
# enough to group similar lengths as well as the whole queue would (alone, it runs as fast as before), few
# enough that its oldest requests finish first. The scan is bounded too: inputs taken from a front's middle
# stay in the arrivals until those before them are taken.
FRONT_BATCHES = 8
FRONT_MOST = 256
FRONT_SCAN = 2


def front_size(max_batch_size: int) -> int:
    return min(FRONT_BATCHES * max_batch_size, FRONT_MOST)


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    largest_batch: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0  # tokens computed, padding included
    dropped_cancelled: int = 0
    waits: int = 0  # batches that waited for company
    overdue: int = 0  # batches that had to hold an item past its queue-delay budget
    filled: int = 0  # less urgent sequences that rode in a more urgent batch
    capped: int = 0  # batches of less urgent work held to the budget while more urgent work was about
    aged: int = 0  # batches that served aged work beside or ahead of more urgent pending work
    beside: int = 0  # batches the express thread ran beside another model's (app.engine.scheduler)
    floor: int = 0  # batches of background work run for its floor (app.engine.floor)
    by_urgency: list[int] = field(default_factory=lambda: [0] * len(URGENCIES))  # sequences batched


class Pending:
    __slots__ = ("arrivals", "buckets", "depth", "seen", "since", "urgency")

    def __init__(self, urgency: int) -> None:
        self.urgency = urgency
        self.buckets: dict[int, deque[Seq]] = {}  # length -> its sequences, oldest first
        self.arrivals: deque[Seq] = deque()  # in arrival order, with taken ones not yet popped
        self.depth = 0
        self.since = 0.0  # when it was last served, or became non-empty: what it ages from
        self.seen = -float("inf")  # when its last sequence arrived

    def oldest(self, taken: set[int]) -> Seq:
        """Its oldest pending sequence (it has one), popping the taken ones before it."""
        arrivals = self.arrivals
        while id(arrivals[0]) in taken:
            taken.discard(id(arrivals.popleft()))
        return arrivals[0]

    def front(self, taken: set[int], limit: int) -> dict[int, int]:
        """How many of each length among its ``limit`` oldest pending sequences (scanning at most
        :data:`FRONT_SCAN` × ``limit`` arrivals): a bucket is in arrival order, so a front's sequences of
        one length are its bucket's head, which is what a batch takes."""
        counts: dict[int, int] = {}
        found = 0
        for seq in itertools.islice(self.arrivals, FRONT_SCAN * limit):
            if id(seq) in taken:
                continue
            counts[seq.length] = counts.get(seq.length, 0) + 1
            found += 1
            if found == limit:
                break
        return counts


def take(
    group: list[Pending], plan: list[tuple[int, int]], now: float, taken: set[int], counts: list[int]
) -> list[Seq]:
    """Remove the planned sequences from ``group``, per length the oldest first across its classes."""
    batch: list[Seq] = []
    for length, k in plan:
        holders = [c for c in group if length in c.buckets]
        for _ in range(k):
            cls = holders[0]
            if len(holders) > 1:  # several classes at one level: the oldest sequence of this length
                cls = min(holders, key=lambda c: c.buckets[length][0].enqueued_at)
            bucket = cls.buckets[length]
            seq = bucket.popleft()
            taken.add(id(seq))
            batch.append(seq)
            cls.depth -= 1
            cls.since = now  # served: it ages from here
            counts[cls.urgency] += 1
            if not bucket:
                del cls.buckets[length]
                holders.remove(cls)
    return batch


def fill(
    batch: list[Seq],
    others: list[Pending],
    top: int,
    room: int,
    now: float,
    taken: set[int],
    counts: list[int],
) -> int:
    """Move up to ``room`` sequences no longer than ``top`` from ``others`` (the more urgent first) into
    ``batch``: a background class's in arrival order up to the first longer one (its requests whole),
    another's longest first. How many."""
    added = 0
    for cls in others:
        before = added
        if cls.urgency in BACKGROUND:
            while added < room and cls.depth:
                seq = cls.oldest(taken)
                if seq.length > top:
                    break
                bucket = cls.buckets[seq.length]
                if bucket[0] is not seq:
                    raise InternalError("a background class's oldest sequence is not first of its length")
                cls.arrivals.popleft()
                bucket.popleft()
                if not bucket:
                    del cls.buckets[seq.length]
                batch.append(seq)
                cls.depth -= 1
                added += 1
        else:
            for length in sorted((n for n in cls.buckets if n <= top), reverse=True):
                bucket = cls.buckets[length]
                while bucket and added < room:
                    seq = bucket.popleft()
                    taken.add(id(seq))
                    batch.append(seq)
                    cls.depth -= 1
                    added += 1
                if not bucket:
                    del cls.buckets[length]
                if added == room:
                    break
        if added > before:
            counts[cls.urgency] += added - before
            cls.since = now
        if added == room:
            break
    return added


def pending_lengths(group: list[Pending], taken: set[int], front: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct pending lengths of ``group`` (sorted) and how many of each; of a background class, over
    its ``front`` oldest only."""
    if len(group) == 1 and group[0].urgency not in BACKGROUND:
        pending = sorted((n, len(b)) for n, b in group[0].buckets.items())
    else:
        merged: dict[int, int] = {}
        for c in group:
            if c.urgency in BACKGROUND:
                for n, k in c.front(taken, front).items():
                    merged[n] = merged.get(n, 0) + k
            else:
                for n, b in c.buckets.items():
                    merged[n] = merged.get(n, 0) + len(b)
        pending = sorted(merged.items())
    lengths = np.array([n for n, _ in pending], dtype=np.int64)
    counts = np.array([k for _, k in pending], dtype=np.int64)
    return lengths, counts


@dataclass(frozen=True)
class Offer:
    """The batch one queue would run next, planned at ``now`` with its lock held: what :meth:`Batcher.cut`
    takes and the scheduler compares. ``level``: the urgency it serves after aging; ``due``: it runs now,
    else at ``due_at`` at the latest; ``seconds``: its modelled time (inf while the scale is unknown);
    ``floor``: it serves background work owed its floor, at the level of the work it goes before."""

    budget_s: float
    now: float
    group: list[Pending]
    aged: bool
    oldest: Seq
    lengths: np.ndarray
    counts: np.ndarray
    window: Window
    overdue: bool
    cap: float | None
    due: bool
    due_at: float
    level: int
    seconds: float
    floor: bool = False
