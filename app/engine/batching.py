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
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.work import WorkItem
from app.errors import InternalError
from app.metrics import Metrics

# How many batches later than first-come-first-served an item may run, passed over for better-fitting ones.
MAX_PASSED_OVER = 4


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
        metrics: Metrics,
        company_expected: Callable[[], bool] = lambda: True,
        overhead_tokens: int = 16,
    ) -> None:
        """``capacity`` bounds the pending items; admission keeps the engine below it.

        ``company_expected`` says whether more inputs are on their way (being tokenised); when none
        are, a batch that is not full runs at once instead of waiting ``max_wait_ms`` for nobody.
        """
        self.metrics = metrics
        self.company_expected = company_expected
        self.overhead_tokens = overhead_tokens
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.capacity = capacity
        self.stats = BatchStats()
        self._pending: list[WorkItem] = []  # in arrival order
        # id(item) -> the batch count by which first-come-first-served would have run it.
        self._due: dict[int, int] = {}
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
            # The batch by which first-come-first-served would have run each item.
            for position, item in enumerate(items, start=len(self._pending)):
                self._due[id(item)] = self.stats.batches + position // self.max_batch_size
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
                if full or remaining <= 0 or not self.company_expected():
                    break
                waited = True
                self._cond.wait(timeout=remaining)
            chosen = {id(item) for item in batch}
            self._pending = [item for item in self._pending if id(item) not in chosen]
            for key in chosen:
                self._due.pop(key, None)
            self._count(batch, waited)
            return batch

    def _drop_cancelled(self) -> None:
        kept = [item for item in self._pending if not item.ticket.cancelled]
        for item in self._pending:
            if item.ticket.cancelled:
                self._due.pop(id(item), None)
        self.stats.dropped_cancelled += len(self._pending) - len(kept)
        self._pending = kept

    def _select(self) -> tuple[list[WorkItem], bool]:
        """The next batch, and whether it is full (whether the caller should run it without waiting).

        The window of length-sorted pending items that does the most useful work per unit of cost; but
        once the oldest item is ``MAX_PASSED_OVER`` batches later than first-come-first-served would
        have run it, the best window that contains it, so an item of an unusual length waits a bounded
        number of batches. When that window is everything pending and more would fit, it is not full:
        the caller may wait for company.
        """
        by_length = sorted(self._pending, key=lambda item: item.length)
        lengths = [item.length for item in by_length]
        oldest = self._pending[0]
        overdue = self.stats.batches - self._due.get(id(oldest), self.stats.batches) >= MAX_PASSED_OVER
        anchor = None
        if overdue:
            # Stable sort: among equal lengths the oldest comes first, so this finds its index.
            anchor = bisect.bisect_left(lengths, oldest.length)
            while by_length[anchor] is not oldest:
                anchor += 1
        lo, hi = self._most_efficient_window(lengths, anchor)
        fits_all = len(lengths) < self.max_batch_size and len(lengths) * lengths[-1] <= self.max_batch_tokens
        if fits_all and hi - lo + 1 == len(lengths):
            # Everything pending makes one batch that is not full yet: the caller may wait for company.
            return by_length, False
        return by_length[lo : hi + 1], True

    def _most_efficient_window(self, lengths: list[int], anchor: int | None) -> tuple[int, int]:
        """``(lo, hi)`` of the window of sorted ``lengths`` that does the most useful work per unit of cost.

        Cost is the tokens computed (padding included) plus ``overhead_tokens`` per batch, so a
        tight batch of 5 beats a padded batch of 8, and one batch of 8 beats 8 batches of 1. With an
        ``anchor``, only windows that contain it.
        """
        n = len(lengths)
        prefix = [0, *itertools.accumulate(lengths)]
        best: tuple[float, int, int] | None = None
        first = 0 if anchor is None else max(0, anchor - self.max_batch_size + 1)
        last = n - 1 if anchor is None else anchor
        for lo in range(first, last + 1):
            for hi in range(max(lo, anchor or 0), min(lo + self.max_batch_size, n)):
                computed = (hi - lo + 1) * lengths[hi]
                if computed > self.max_batch_tokens and hi > lo:
                    break
                efficiency = (prefix[hi + 1] - prefix[lo]) / (computed + self.overhead_tokens)
                if best is None or efficiency > best[0]:
                    best = (efficiency, lo, hi)
        if best is None:
            raise InternalError(f"no batch window in a queue of {n} items")
        return best[1], best[2]

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
