"""What the batch queue (:mod:`app.engine.batching`) holds: the pending sequences of one urgency, the
batch it offers to run next, and the counters of what the assembler did."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from app.engine.planner import Window
from app.engine.priority import URGENCIES
from app.engine.work import Seq

if TYPE_CHECKING:
    from app.engine.batching import Batcher


@dataclass
class BatchStats:
    """Counters of what the assembler did; read by /info and by tests."""

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
    by_urgency: list[int] = field(default_factory=lambda: [0] * len(URGENCIES))  # sequences batched


class Pending:
    """The pending sequences of one urgency."""

    __slots__ = ("arrivals", "buckets", "depth", "seen", "since", "urgency")

    def __init__(self, urgency: int) -> None:
        self.urgency = urgency
        self.buckets: dict[int, deque[Seq]] = {}  # length -> its sequences, oldest first
        self.arrivals: deque[Seq] = deque()  # in arrival order, with taken ones not yet popped
        self.depth = 0
        self.since = 0.0  # when it was last served, or became non-empty: what it ages from
        self.seen = -float("inf")  # when its last sequence arrived


def pending_lengths(group: list[Pending]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct pending lengths of ``group`` (sorted) and how many of each."""
    if len(group) == 1:
        pending = sorted((n, len(b)) for n, b in group[0].buckets.items())
    else:
        merged: dict[int, int] = {}
        for c in group:
            for n, b in c.buckets.items():
                merged[n] = merged.get(n, 0) + len(b)
        pending = sorted(merged.items())
    lengths = np.array([n for n, _ in pending], dtype=np.int64)
    counts = np.array([k for _, k in pending], dtype=np.int64)
    return lengths, counts


@dataclass(frozen=True)
class Offer:
    """The batch one queue would run next (:meth:`Batcher.offer`), planned at ``now`` with its lock held:
    what :meth:`Batcher.cut` takes, and what the inference thread compares across the queues of several
    models (:mod:`app.engine.scheduler`).

    ``level``: the urgency it serves, after aging (lower runs first); ``due``: it runs now (full, past the
    company wait, or nobody else coming), else at ``due_at`` at the latest; ``overdue``: it holds an input
    past its queue-delay budget; ``window.efficiency``: the share of its modelled cost that is useful work;
    ``seconds``: its modelled time (infinite while the constant model has no scale yet).
    """

    batcher: Batcher
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
