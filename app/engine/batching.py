"""Stage 3, batch assembly: where a batch is built.

Pending items are grouped by length so little padding is computed. A batch is capped by a token budget
that charges padding (``size × longest ≤ max_batch_tokens``) and by ``max_batch_size``. It is anchored
on the oldest pending item, so no item starves behind a stream of better-fitting ones. When the queue
holds too little to fill a batch, the assembler waits for company, at most ``max_wait_ms`` counted from
the oldest item's arrival; when there is enough work it never waits. Items whose request was cancelled
are dropped here, before they cost any inference.

The assembler thread builds the next batch while the inference thread runs the current one: a slot
holds at most one built batch, so batches are cut as late as possible and nothing piles up.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.work import WorkItem
from app.metrics import Metrics


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


class Batcher:
    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        max_wait_ms: float,
        capacity: int,
        metrics: Metrics | None = None,
    ) -> None:
        """``capacity`` bounds the pending items; admission keeps the engine below it."""
        self.metrics = metrics or Metrics()
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.capacity = capacity
        self.stats = BatchStats()
        self._pending: list[WorkItem] = []  # in arrival order
        self._cond = threading.Condition()
        self._stopped = False

    @property
    def depth(self) -> int:
        return len(self._pending)

    def submit(self, items: list[WorkItem]) -> None:
        with self._cond:
            if len(self._pending) + len(items) > self.capacity:
                raise RuntimeError(
                    f"batch queue over its bound ({len(self._pending)} + {len(items)} > {self.capacity}): "
                    "admission should have prevented this"
                )
            self._pending.extend(items)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake the assembler to drop cancelled items."""
        with self._cond:
            self._cond.notify_all()

    def next_batch(self) -> list[WorkItem] | None:
        """Block until a batch is due and return it (None once stopped)."""
        with self._cond:
            waited = False
            while True:
                if self._stopped:
                    return None
                self._drop_cancelled()
                if not self._pending:
                    self._cond.wait()
                    continue
                batch, full = self._select()
                deadline = self._pending[0].enqueued_at + self.max_wait_s
                remaining = deadline - time.perf_counter()
                if full or remaining <= 0:
                    break
                waited = True
                self._cond.wait(timeout=remaining)
            chosen = {id(item) for item in batch}
            self._pending = [item for item in self._pending if id(item) not in chosen]
            self._count(batch, waited)
            return batch

    def _drop_cancelled(self) -> None:
        kept = [item for item in self._pending if not item.ticket.cancelled]
        self.stats.dropped_cancelled += len(self._pending) - len(kept)
        self._pending = kept

    def _select(self) -> tuple[list[WorkItem], bool]:
        """The batch around the oldest item, and whether it is full (more items would not fit)."""
        by_length = sorted(self._pending, key=lambda item: item.length)
        lengths = [item.length for item in by_length]
        anchor = self._pending[0]
        # Stable sort: among equal lengths the oldest comes first, so this finds the anchor's index.
        i = bisect.bisect_left(lengths, anchor.length)
        while by_length[i] is not anchor:
            i += 1
        lo, hi = i, i  # the window by_length[lo..hi]; grown by the neighbour that adds least padding
        budget = self.max_batch_tokens
        while hi - lo + 1 < self.max_batch_size:
            size = hi - lo + 1
            options = []  # (padding added, new lo, new hi)
            if lo > 0 and (size + 1) * lengths[hi] <= budget:
                options.append((lengths[hi] - lengths[lo - 1], lo - 1, hi))
            if hi + 1 < len(lengths) and (size + 1) * lengths[hi + 1] <= budget:
                options.append((size * (lengths[hi + 1] - lengths[hi]), lo, hi + 1))
            if not options:
                break
            _, lo, hi = min(options)
        size = hi - lo + 1
        full = size >= self.max_batch_size or (size + 1) * lengths[hi] > self.max_batch_tokens
        # Not full because the queue ran out: a neighbour exists only if the window hit a bound.
        if not full and (lo > 0 or hi + 1 < len(lengths)):
            full = True
        return by_length[lo : hi + 1], full

    def _count(self, batch: list[WorkItem], waited: bool) -> None:
        s = self.stats
        s.batches += 1
        s.items += len(batch)
        s.largest_batch = max(s.largest_batch, len(batch))
        real = sum(item.length for item in batch)
        computed = len(batch) * max(item.length for item in batch)
        s.real_tokens += real
        s.padded_tokens += computed
        s.waits += int(waited)
        self.metrics.batch_assembled(len(batch), real, computed)


def run_assembler(
    batcher: Batcher, wait_for_slot: Callable[[], bool], deliver: Callable[[list[WorkItem]], None]
) -> None:
    """The assembler thread's loop.

    ``wait_for_slot`` blocks until the inference stage can take one more batch (False once stopping),
    so a batch is cut only when it is about to be needed and collects the latest arrivals.
    """
    while wait_for_slot():
        batch = batcher.next_batch()
        if batch is None:
            return
        deliver(batch)
