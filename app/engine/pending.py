"""What the batch queue (:mod:`app.engine.batching`) holds: the pending sequences of one urgency, and
the counters of what the assembler did."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.engine.priority import URGENCIES
from app.engine.work import Seq


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
