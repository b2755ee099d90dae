"""The batch queue's data: a class of pending sequences per urgency (:class:`Pending`, one FIFO per length
and its arrival order), the lengths a plan is made over, the :class:`Offer` a plan makes, and the queue's
counters (:class:`BatchStats`). What the queue does with them is :mod:`app.engine.batching`'s.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from app.engine.planner import Window
from app.engine.priority import BACKGROUND, URGENCIES
from app.engine.work import Seq

# A background class is planned over its oldest inputs, this many full batches' worth (at most FRONT_MOST):
# enough to group similar lengths as well as the whole queue would (alone, it runs as fast as before), few
# enough that its oldest requests finish first. The scan is bounded too: inputs taken from a front's middle
# stay in the arrivals until those before them are taken.
FRONT_BATCHES = 8
FRONT_MOST = 256
FRONT_SCAN = 2


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
    floor: int = 0  # batches of background work run for its floor (Floor)
    by_urgency: list[int] = field(default_factory=lambda: [0] * len(URGENCIES))  # sequences batched


class Pending:
    __slots__ = ("arrivals", "buckets", "depth", "seen", "since", "urgency")

    def __init__(self, urgency: int) -> None:
        self.urgency = urgency
        # Length -> its sequences, oldest first.
        self.buckets: defaultdict[int, deque[Seq]] = defaultdict(deque)
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
        """How many of each length among its ``limit`` oldest pending sequences: of one length, they are its
        bucket's head (a bucket is in arrival order), which is what a batch takes."""
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
    """The batch one queue would run next, planned at ``now``: ``level`` is its urgency after aging, ``due``
    whether it runs now (else at ``due_at``), ``seconds`` its modelled time (inf while the scale is unknown),
    ``floor`` whether it serves background owed its floor."""

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
