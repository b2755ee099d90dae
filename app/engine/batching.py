"""Stage 3, batch assembly: where a batch is built.

Pending items are grouped by length so little padding is computed. A batch is capped by a token budget
that charges padding (``size × longest ≤ max_batch_tokens``) and by ``max_batch_size``. It is anchored
on the oldest pending item, so no item starves behind a stream of better-fitting ones. When the queue
holds too little to fill a batch, the assembler waits for company, at most ``max_wait_ms`` counted from
the oldest item's arrival; when there is enough work it never waits. Items whose request was cancelled
are dropped here, before they cost any inference.

The inference thread cuts each batch itself, right after the previous one has run (:mod:`app.engine.inference`):
a batch is cut as late as possible, from everything that arrived meanwhile, and nothing piles up.

While the assembler waits for company, an arrival wakes it only when it may change the answer: when the
queue may now hold a full batch (``max_batch_size`` sequences, or more padded tokens than
``max_batch_tokens``), or when no more inputs are on their way. Re-planning the batch on every arrival
cost one numpy plan per request at 32 clients × 1 text.

Cost per batch does not grow with the queue's items: pending sequences wait in one FIFO bucket per
length, the choice of a batch is a few numpy operations over the distinct lengths, and cancelled
sequences are swept out only when a request is cancelled (thousands of queued texts used to be sorted
and scanned in Python for every batch: 256 clients × 32 texts ran at half the rate of 8 × 32).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.work import Sequence
from app.errors import InternalError
from app.telemetry.metrics import Metrics

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
        """``capacity`` bounds the pending sequences; admission keeps the engine below it.

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
        self._buckets: dict[int, deque[Sequence]] = {}  # length -> its sequences, oldest first
        self._arrivals: deque[Sequence] = deque()  # every pending sequence in arrival order, and taken ones
        self._taken: set[int] = set()  # ids of sequences batched (or dropped) but still in _arrivals
        self._depth = 0
        self._cond = threading.Condition()
        self._stopped = False
        # Window sizes 1..max_batch_size as a row, and which is the single-sequence window: every plan uses them.
        self._sizes = np.arange(1, max_batch_size + 1)[None, :]
        self._single = self._sizes == 1
        self._idle = False  # the assembler waits for any sequence at all
        self._gathering = False  # the assembler waits for company until a deadline

    @property
    def depth(self) -> int:
        return self._depth

    def submit(self, sequences: list[Sequence]) -> None:
        with self._cond:
            if self._depth + len(sequences) > self.capacity:
                raise RuntimeError(
                    f"batch queue over its bound ({self._depth} + {len(sequences)} > {self.capacity}): "
                    "admission should have prevented this"
                )
            # The batch by which first-come-first-served would have run each sequence.
            first, size = self.stats.batches, self.max_batch_size
            for position, seq in enumerate(sequences, start=self._depth):
                seq.due = first + position // size
                bucket = self._buckets.get(seq.length)
                if bucket is None:
                    bucket = self._buckets[seq.length] = deque()
                bucket.append(seq)
            self._arrivals.extend(sequences)
            self._depth += len(sequences)
            if self._idle or (self._gathering and self._may_be_due()):
                self._cond.notify_all()

    def _may_be_due(self) -> bool:
        """Whether the waiting assembler should plan again: the queue may hold a full batch, or nobody
        else is coming. Cheap (no plan): an upper bound on what a plan would find."""
        if self._depth >= self.max_batch_size or not self.company_expected():
            return True
        return self._depth * max(self._buckets) > self.max_batch_tokens

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def poke(self) -> None:
        """A request was cancelled: drop its pending sequences now, so they neither run nor count."""
        with self._cond:
            self._drop_cancelled()
            self._cond.notify_all()

    def next_batch(self) -> list[Sequence] | None:
        """Block until a batch is due and return it (None once stopped)."""
        with self._cond:
            waited = False
            while True:
                if self._stopped:
                    return None
                oldest = self._oldest()
                if oldest is None:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    continue
                if oldest.job.cancelled:
                    self._drop_cancelled()
                    continue
                plan, full = self._select(oldest)
                remaining = oldest.enqueued_at + self.max_wait_s - time.perf_counter()
                if full or remaining <= 0 or not self.company_expected():
                    break
                waited = True
                self._gathering = True
                self._cond.wait(timeout=remaining)
                self._gathering = False
            batch = self._take(plan)
            self._count(batch, waited)
            return batch

    def _oldest(self) -> Sequence | None:
        arrivals = self._arrivals
        while arrivals and id(arrivals[0]) in self._taken:
            self._taken.discard(id(arrivals.popleft()))
        return arrivals[0] if arrivals else None

    def _drop_cancelled(self) -> None:
        dropped = 0
        for length in list(self._buckets):
            bucket = self._buckets[length]
            kept = deque(seq for seq in bucket if not seq.job.cancelled)
            if len(kept) != len(bucket):
                for seq in bucket:
                    if seq.job.cancelled:
                        self._taken.add(id(seq))
                dropped += len(bucket) - len(kept)
                if kept:
                    self._buckets[length] = kept
                else:
                    del self._buckets[length]
        self._depth -= dropped
        self.stats.dropped_cancelled += dropped

    def _select(self, oldest: Sequence) -> tuple[list[tuple[int, int]], bool]:
        """The next batch as ``(length, how many)`` per bucket, and whether it is full (run it now).

        Among windows of the length-sorted pending sequences, the one that does the most useful work per
        unit of cost; but once the oldest sequence is ``MAX_PASSED_OVER`` batches later than
        first-come-first-served would have run it, the best window that contains it, so a sequence of an
        unusual length waits a bounded number of batches. When that window is everything pending and more
        would fit, it is not full: the caller may wait for company.
        """
        pending = sorted(self._buckets.items())
        lengths = np.array([n for n, _ in pending], dtype=np.int64)
        counts = np.array([len(bucket) for _, bucket in pending], dtype=np.int64)
        anchor = None
        if self.stats.batches - oldest.due >= MAX_PASSED_OVER:
            anchor = int(np.searchsorted(lengths, oldest.length))
        top, size = self._most_efficient_window(lengths, counts, anchor)
        n = int(counts.sum())
        fits_all = n < self.max_batch_size and n * int(lengths[-1]) <= self.max_batch_tokens
        plan = []
        for i in range(top, -1, -1):  # the window: `size` sequences, from the top length down
            take = min(int(counts[i]), size)
            plan.append((int(lengths[i]), take))
            size -= take
            if size == 0:
                break
        return plan, not (fits_all and sum(take for _, take in plan) == n)

    def _most_efficient_window(
        self, lengths: np.ndarray, counts: np.ndarray, anchor: int | None
    ) -> tuple[int, int]:
        """``(top, size)``: the window of ``size`` sequences whose longest is ``lengths[top]`` (and the
        rest the next shorter ones) that does the most useful work per unit of cost.

        Cost is the tokens computed (padding included) plus ``overhead_tokens`` per batch, so a tight
        batch of 5 beats a padded batch of 8, and one batch of 8 beats 8 batches of 1. A window ending
        inside a run of equal lengths is never better than one ending at the run's end, so only the last
        sequence of each length is a candidate top: distinct lengths × sizes, in numpy. With an
        ``anchor`` (index into ``lengths``), only windows that include a sequence of that length; of
        those, ones whose top is the anchor's length or a longer one taken whole (a window that would
        take the anchor plus part of a longer run is not considered: the anchor then runs with shorter
        company, still within the bound).
        """
        ends = np.cumsum(counts)  # exclusive end of each length's run in the sorted sequence
        width = min(self.max_batch_size, int(ends[-1]))  # no window holds more than is pending
        sizes = self._sizes[:, :width]
        starts = ends[:, None] - sizes  # first sequence of each (top, size) window
        valid = starts >= 0
        starts = np.maximum(starts, 0)
        run = np.searchsorted(ends, starts, side="right")  # the length run each window starts in
        # Real tokens: every run after the starting one up to the top, and the starting run's share.
        tokens = np.cumsum(lengths * counts)
        real = tokens[:, None] - tokens[run] + (ends[run] - starts) * lengths[run]
        computed = sizes * lengths[:, None]
        valid &= (computed <= self.max_batch_tokens) | self._single[:, :width]
        if anchor is not None:
            valid &= (np.arange(len(lengths))[:, None] >= anchor) & (starts < ends[anchor])
        efficiency = np.where(valid, real / (computed + self.overhead_tokens), -1.0)
        best = int(np.argmax(efficiency))
        top, size = divmod(best, width)
        if efficiency.flat[best] < 0:
            raise InternalError(f"no batch window among {len(lengths)} lengths")
        return top, size + 1

    def _take(self, plan: list[tuple[int, int]]) -> list[Sequence]:
        """Remove the planned sequences (oldest first in each length) from the queue."""
        batch: list[Sequence] = []
        for length, take in plan:
            bucket = self._buckets[length]
            for _ in range(take):
                seq = bucket.popleft()
                self._taken.add(id(seq))
                batch.append(seq)
            if not bucket:
                del self._buckets[length]
        self._depth -= len(batch)
        return batch

    def _count(self, batch: list[Sequence], waited: bool) -> None:
        s = self.stats
        s.batches += 1
        s.items += len(batch)
        s.largest_batch = max(s.largest_batch, len(batch))
        real = sum(seq.length for seq in batch)
        computed = len(batch) * max(seq.length for seq in batch)
        s.real_tokens += real
        s.padded_tokens += computed
        s.waits += int(waited)
        self.metrics.batch_assembled(len(batch), real, computed)
