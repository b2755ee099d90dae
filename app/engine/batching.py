"""Stage 3, batch assembly: the queue of pending sequences, and when and with what its next batch runs.

Sequences wait in one class per urgency (:class:`~app.engine.pending.Pending`), within it in one FIFO per
length. The queue plans (:meth:`Batcher.offer`) and cuts (:meth:`Batcher.cut`); when, and whose, is the
scheduler's. Its rules are in docs/architecture.md.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator

import numpy as np

from app.engine.clock import Clock
from app.engine.costs import CostModel, Refitter
from app.engine.pending import FRONT_BATCHES, FRONT_MOST, BatchStats, Offer, Pending, pending_lengths
from app.engine.planner import Planner
from app.engine.priority import BACKGROUND, URGENCIES, aged_level
from app.engine.work import Seq
from app.telemetry.metrics import Metrics

# More urgent work counts as about this long after its last arrival: closed-loop clients come back within
# milliseconds, and a trickle of queries every second should still find the server responsive.
ACTIVE_S = 1.0
# The derived queue-delay budget, in full batches of the mean length seen: half a batch, so an item waits
# at most about the batch in progress, half a batch more, and its own.
DERIVED_BUDGET_BATCHES = 0.5
LENGTH_WEIGHT = 0.1  # per batch, of the moving mean length the derived budget is computed for
SCALE_WEIGHT = 0.2  # per batch, of the moving seconds per unit of modelled cost
INITIAL_LENGTH = 32.0
# A floor batch is the cheapest window doing at least this share of the best useful work per second the
# queue offers: small on a CPU (one input is nearly as efficient as eight), full on a GPU (it is not).
THRIFT = 0.8


class Floor:
    """Background's floor: work less urgent than the default gets a share of the modelled time, under any
    load. A deficit account per queue, in the cost model's unit (docs/architecture.md): each batch while
    background waits beside more urgent work adds ``share`` × its cost and takes off the worth of the
    background it held; ``owed`` is what background is owed (positive: it is served next)."""

    __slots__ = ("owed", "share")

    def __init__(self, share: float) -> None:
        self.share = share
        self.owed = 0.0

    def due(self) -> bool:
        return self.share > 0 and self.owed > 0

    def account(self, cost: float, worth: float, bound: float) -> None:
        """A batch of ``cost`` ran, holding background inputs of ``worth``; ``bound``: a full batch's cost."""
        owed = self.owed + self.share * cost - worth
        self.owed = min(bound, max(-bound, owed))

    def clear(self) -> None:  # no background work waits
        self.owed = 0.0


class Batcher:
    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        max_wait_ms: float,
        capacity: int,
        metrics: Metrics,
        company_expected: Callable[[], bool] = lambda: True,
        costs: CostModel | None = None,
        max_queue_delay_ms: float | None = None,
        urgency_aging_ms: float = 1000.0,
        clock: Clock | None = None,
        max_batch_attention: int = 0,
        cond: threading.Condition | None = None,
        background_share: float = 0.1,
    ) -> None:
        """``company_expected``: whether more inputs are being tokenised (if not, nothing waits for company);
        ``clock`` and ``cond``: the scheduler's (the sequences' ``enqueued_at`` must come from that clock)."""
        self.clock = clock or Clock()
        self._now = self.clock.now
        self.metrics = metrics
        self.company_expected = company_expected
        self.max_batch_size = max_batch_size
        self._limits = (max_batch_size, max_batch_tokens, max_batch_attention)  # a planner's
        self.max_wait_s = max_wait_ms / 1000
        self.max_queue_delay_s = max_queue_delay_ms / 1000 if max_queue_delay_ms is not None else None
        self.aging_s = urgency_aging_ms / 1000
        self.capacity = capacity
        self.stats = BatchStats()
        self._classes = [Pending(u) for u in URGENCIES]
        self._foreground = self._classes[: BACKGROUND.start]
        self._background = self._classes[BACKGROUND.start :]
        self.floor = Floor(background_share)
        self._front = min(FRONT_BATCHES * max_batch_size, FRONT_MOST)  # background's, planned over
        self._taken: set[int] = set()  # ids of sequences batched (or dropped) but still in an arrivals deque
        self.depth = 0
        self._cond = cond if cond is not None else threading.Condition()
        self._idle = False  # the scheduler waits for any sequence at all
        self._gathering = False  # the scheduler waits for company until a deadline
        self._mean_length = INITIAL_LENGTH
        self._last_cost = 0.0  # modelled cost of the batch handed out last
        self._last_shape = (0, 0)  # its size and longest length
        self._refitter: Refitter | None = None
        self._scale: float | None = None  # seconds per unit of modelled cost; None: not known yet
        self.planner: Planner  # by set_costs, now and whenever the cost model changes
        self.set_costs(costs or CostModel.constant(16))

    def set_costs(self, costs: CostModel) -> None:
        """Plan by ``costs`` from now on (the inference thread calls it once it has measured or read them)."""
        with self._cond:
            self.planner = Planner(costs, *self._limits)
            self._scale = 1.0 if costs.measured else None
            self._refitter = Refitter(costs) if costs.measured and costs.points else None

    @property
    def costs(self) -> CostModel:
        return self.planner.model

    def depth_of(self, urgency: int) -> int:
        return self._classes[urgency].depth

    def budget_s(self) -> float:
        """The queue-delay budget now, in seconds (infinite while the constant model has no scale yet)."""
        if self.max_queue_delay_s is not None:
            return self.max_queue_delay_s
        if self._scale is None:
            return float("inf")
        return DERIVED_BUDGET_BATCHES * self.planner.full_batch_cost(self._mean_length) * self._scale

    def submit(self, sequences: list[Seq]) -> None:
        """Queue one job's sequences (they share its urgency); none once it is cancelled or failed."""
        if not sequences:
            return
        with self._cond:
            if sequences[0].job.cancelled:
                return
            if self.depth + len(sequences) > self.capacity:
                raise RuntimeError(
                    f"batch queue over its bound ({self.depth} + {len(sequences)} > {self.capacity}): "
                    "admission should have prevented this"
                )
            now = self._now()
            cls = self._classes[sequences[0].job.urgency]
            if cls.depth == 0:
                cls.since = now
            cls.seen = now
            for seq in sequences:
                cls.buckets[seq.length].append(seq)
            cls.arrivals.extend(sequences)
            cls.depth += len(sequences)
            self.depth += len(sequences)
            if self._idle or (self._gathering and self._may_be_due()):
                self._cond.notify_all()

    def _may_be_due(self) -> bool:
        """An upper bound, without planning: the queue may hold a full batch, or nobody else is coming."""
        if self.depth >= self.max_batch_size or not self.company_expected():
            return True
        longest = max(max(c.buckets) for c in self._classes if c.buckets)
        return self.depth >= self.planner.limits.room(longest)

    def poke(self) -> None:
        """A request was cancelled or failed: drop its pending sequences, so they neither run nor count."""
        with self._cond:
            self._drop_cancelled()
            self._cond.notify_all()

    def _drop_cancelled(self) -> None:
        dropped = 0
        for cls in self._classes:
            for length, bucket in list(cls.buckets.items()):
                kept = deque(seq for seq in bucket if not seq.job.cancelled)
                if len(kept) == len(bucket):
                    continue
                self._taken.update(id(seq) for seq in bucket if seq.job.cancelled)
                gone = len(bucket) - len(kept)
                cls.depth -= gone
                dropped += gone
                if kept:
                    cls.buckets[length] = kept
                else:
                    del cls.buckets[length]
        self.depth -= dropped
        self.stats.dropped_cancelled += dropped

    def ran(self, seconds: float) -> None:
        """The batch handed out last ran in ``seconds`` (inference thread): a measured model is refitted
        from it; the constant one learns seconds per token."""
        if self._refitter is not None:
            refitted = self._refitter.add(*self._last_shape, seconds)
            if refitted is not None:
                with self._cond:
                    self.planner = Planner(refitted, *self._limits)
        elif self._last_cost > 0:
            ratio = seconds / self._last_cost
            scale = self._scale
            self._scale = ratio if scale is None else scale + SCALE_WEIGHT * (ratio - scale)

    def offer(self, now: float, seen: list[float] | None = None) -> Offer | None:
        """The batch this queue would run next (the lock held, something pending); None when its oldest was
        cancelled (then dropped). ``seen``: when each urgency last arrived at the scheduler's queues."""
        group, aged = self._group(now, self._classes)
        level = aged_level(group[0].urgency, group[0].since, now, self.aging_s)
        floor = self.floor.due() and group[-1].urgency not in BACKGROUND and self._contended()
        if floor:  # background is owed its floor: its batch goes first, at the level it goes before
            group, aged = self._group(now, self._background)[0], False
        oldest = min((c.oldest(self._taken) for c in group), key=lambda s: s.enqueued_at)
        if oldest.job.cancelled:
            self._drop_cancelled()
            return None
        lengths, counts = pending_lengths(group, self._taken, self._front)
        at = int(np.searchsorted(lengths, oldest.length))
        budget = self.budget_s()
        overdue = now - oldest.enqueued_at > budget
        whole = group[0].urgency in BACKGROUND  # its requests whole, the oldest first
        cap = self._cap(group[-1].urgency, now, seen)
        if floor and cap is not None:  # as much as its oldest alone, over THRIFT: on a GPU, a full batch
            cap = max(cap, self.planner.model.cost(1, oldest.length) / THRIFT)
        anchor = at if overdue or whole else None
        thrift = THRIFT if floor else None  # a floor batch: the cheapest efficient one that pays what is owed
        window = self.planner.choose(lengths, counts, anchor, cap, thrift, self.floor.owed)
        n = int(counts.sum())
        fits_all = n < self.max_batch_size and self.planner.limits.allows(n, int(lengths[-1]))
        full = not (fits_all and window.size == n)
        due_at = oldest.enqueued_at + self.max_wait_s
        due = floor or full or due_at <= now or not self.company_expected()
        seconds = window.cost * self._scale if self._scale is not None else float("inf")
        planned = (lengths, counts, window, overdue, cap, due, due_at, level, seconds, floor)
        return Offer(budget, now, group, aged, oldest, *planned)

    def cut(self, offer: Offer, waited: bool) -> list[Seq]:
        """Take the batch :meth:`offer` planned (the lock held since) and its fill out; count it."""
        group, lengths, window, now = offer.group, offer.lengths, offer.window, offer.now
        contended = self._contended()
        batch = self._take(group, self.planner.take(lengths, offer.counts, window), now)
        filled = self._fill(batch, group, int(lengths[window.top]), offer.oldest, now)
        s, size = self.stats, len(batch)
        s.batches += 1
        s.items += size
        s.largest_batch = max(s.largest_batch, size)
        real = sum(seq.length for seq in batch)
        longest = max(seq.length for seq in batch)
        rows, length = self.planner.model.shape(size, longest)  # on a grid, the padded shape
        s.real_tokens += real
        s.padded_tokens += (computed := rows * length)
        s.waits += int(waited)
        s.overdue += int(offer.overdue)
        s.capped += int(offer.cap is not None)
        s.aged += int(offer.aged)
        s.filled += filled
        s.floor += offer.floor
        self._last_cost = self.planner.model.cost(size, longest)
        self._last_shape = (size, longest)
        self._mean_length += LENGTH_WEIGHT * (real / size - self._mean_length)
        self.metrics.batch_assembled(size, real, computed)
        if not any(c.depth for c in self._background):
            self.floor.clear()
        elif contended:  # what background got of what it is owed, in worth (Floor)
            mine = np.array([seq.length for seq in batch if seq.job.urgency in BACKGROUND], dtype=np.int64)
            worth = float(self.planner.worth(mine).sum()) if len(mine) else 0.0
            self.floor.account(self._last_cost, worth, self.planner.full_batch_cost(self._mean_length))
        return batch

    def _contended(self) -> bool:  # background work waits beside more urgent work
        return any(c.depth for c in self._background) and any(c.depth for c in self._foreground)

    def listen(self, on: bool) -> None:
        self._idle, self._gathering = on and not self.depth, on and self.depth > 0

    def seen(self) -> list[float]:
        """When work of each urgency last arrived here (``-inf``: never)."""
        return [c.seen for c in self._classes]

    def _group(self, now: float, classes: list[Pending]) -> tuple[list[Pending], bool]:
        """Of ``classes``, those served next (the most urgent level after aging), and whether aging put a
        less urgent class beside or ahead of the most urgent one pending."""
        present = [c for c in classes if c.depth]
        levels = [aged_level(c.urgency, c.since, now, self.aging_s) for c in present]
        best = min(levels)
        group = [c for c, level in zip(present, levels, strict=True) if level == best]
        return group, group[-1].urgency > present[0].urgency

    def _cap(self, urgency: int, now: float, seen: list[float] | None = None) -> float | None:
        """The cost bound (model units) of a batch serving ``urgency``: the budget while more urgent work
        was seen within ACTIVE_S (here, or in ``seen``); None otherwise, or while the scale is unknown."""
        arrived = seen or [c.seen for c in self._classes]
        if self._scale is None or not any(now - t < ACTIVE_S for t in arrived[:urgency]):
            return None
        budget = self.budget_s()
        return budget / self._scale if budget != float("inf") else None

    def _take(self, group: list[Pending], plan: list[tuple[int, int]], now: float) -> list[Seq]:
        """Remove the planned sequences from ``group``, per length the oldest first across its classes."""
        taken, counts = self._taken, self.stats.by_urgency
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
        self.depth -= len(batch)
        return batch

    def _fill(self, batch: list[Seq], group: list[Pending], top: int, oldest: Seq, now: float) -> int:
        """Add less urgent sequences no longer than ``top``, as many as room and ``oldest``'s budget allow:
        a background class's in arrival order (its requests whole), another's longest first. How many."""
        others = [c for c in self._classes if c.depth and c not in group]
        if not others or self._scale is None or (room := self.planner.limits.room(top) - len(batch)) <= 0:
            return 0  # none to add, no budget known yet, or no room (the usual case under load)
        slack = (self.budget_s() - (now - oldest.enqueued_at)) / self._scale
        if (each := float(self.planner.model.per_sequence(np.array([top]))[0])) > 0:
            room = min(room, int(slack // each))
        taken, before = self._taken, len(batch)
        for cls in others:
            left = room - (len(batch) - before)
            if left <= 0:
                break
            lengths: Iterator[int]  # of the sequences to take, in the order they are taken
            if cls.urgency in BACKGROUND:  # in arrival order, up to its first sequence longer than top
                cls.oldest(taken)  # the taken ones before it popped
                arrived = (s.length for s in cls.arrivals if id(s) not in taken)
                lengths = itertools.takewhile(lambda n: n <= top, arrived)
            else:  # the longest first
                lengths = (n for n in sorted(cls.buckets, reverse=True) if n <= top for _ in cls.buckets[n])
            plan = Counter(itertools.islice(lengths, left))
            batch += self._take([cls], list(plan.items()), now)
        return len(batch) - before
