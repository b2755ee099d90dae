"""Which batch to run next, by what it costs: a few numpy operations over the distinct pending lengths.

The queue (:mod:`app.engine.batching`) hands over the pending sequences of the work it serves as distinct
lengths (sorted) and a count of each. A candidate batch is a *window* of that length-sorted sequence:
``size`` sequences whose longest has length ``lengths[top]``, the rest the next shorter ones (a window
ending inside a run of equal lengths is never better than one ending at the run's end, so only each run's
last sequence is a candidate top: distinct lengths × sizes). What a window costs comes from the
:class:`~app.engine.costs.CostModel`; what it is worth is what its sequences would cost in the best batch
they could be in (as many of their own length as the limits allow), so a window's *efficiency* (worth /
cost, at most about 1) says how much of its cost is useful work, for short and long sequences alike.

- When the queue holds more than one batch, the most efficient window runs.
- When everything pending fits in one batch (the queue is short), lengths are grouped only where the model
  says it pays: of the plans "this window now, the rest as one batch right after it" (one of which is "all
  of it now"), the one that costs least in all, unless it saves less than :data:`GROUPING_GAIN` of all at
  once; of plans that cost the same, the one that runs the oldest item first, then the one that leaves
  the fewest waiting. On a CPU, where a batch costs about its tokens, a short and a long group
  run apart; on a GPU, where a batch costs about its launch, everything runs together.
- An ``anchor`` (an item that has waited past its budget) must be in the window; a ``cap`` bounds the
  window's cost (less urgent work while more urgent work is about).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.costs import CostModel
from app.errors import InternalError

# In a short queue, lengths run apart only where that saves at least this share of running them together:
# a smaller saving is within the fitted model's error, and the group that runs second waits for it.
GROUPING_GAIN = 0.1


@dataclass(frozen=True)
class Window:
    """``size`` sequences with the longest at ``lengths[top]``; what it costs, in the model's unit."""

    top: int
    size: int
    cost: float


class Planner:
    """The batch limits and the cost model, with what every plan reuses (window sizes as a row)."""

    def __init__(self, model: CostModel, max_batch_size: int, max_batch_tokens: int) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self._sizes = np.arange(1, max_batch_size + 1)[None, :]

    def worth(self, lengths: np.ndarray) -> np.ndarray:
        """What a sequence of each length costs in the best batch the limits allow it (the model's unit)."""
        best = np.clip(self.max_batch_tokens // np.maximum(lengths, 1), 1, self.max_batch_size)
        return self.model.a / best + self.model.per_sequence(lengths)

    def full_batch_cost(self, length: float) -> float:
        """What a full batch of sequences of ``length`` costs: as many as the limits allow."""
        size = max(1, min(self.max_batch_size, int(self.max_batch_tokens // max(length, 1.0))))
        return self.model.cost(size, round(length))

    def choose(
        self,
        lengths: np.ndarray,
        counts: np.ndarray,
        anchor: int | None = None,
        cap: float | None = None,
        oldest: int | None = None,
    ) -> Window:
        """The window to run (see the module). ``anchor`` (an index into ``lengths``) must be in it; ``cap``
        (the model's unit) bounds its cost; ``oldest`` (an index) breaks ties in a short queue: of two
        plans that cost the same, the one that runs the oldest item first.

        Raises:
            InternalError: no window is allowed (cannot happen: one sequence alone always is).
        """
        ends = np.cumsum(counts)  # exclusive end of each length's run in the sorted sequence
        n = int(ends[-1])
        width = min(self.max_batch_size, n)  # no window holds more than is pending
        sizes = self._sizes[:, :width]
        starts = ends[:, None] - sizes  # first sequence of each (top, size) window
        valid = starts >= 0
        starts = np.maximum(starts, 0)
        per_sequence = self.model.per_sequence(lengths)
        cost = self.model.a + sizes * per_sequence[:, None]
        single = sizes == 1
        valid &= (sizes * lengths[:, None] <= self.max_batch_tokens) | single
        if cap is not None:
            valid &= (cost <= cap) | single
        tops = np.arange(len(lengths))[:, None]
        if anchor is not None:
            valid &= (tops >= anchor) & (starts < ends[anchor])
        if n <= self.max_batch_size and n * int(lengths[-1]) <= self.max_batch_tokens:
            best = self._short(lengths, ends, starts, sizes, cost, per_sequence, valid, oldest)
        else:
            worth = self.worth(lengths)
            total = np.cumsum(worth * counts)
            run = np.searchsorted(ends, starts, side="right")  # the length run each window starts in
            # Worth of every run after the starting one up to the top, and the starting run's share.
            useful = total[:, None] - total[run] + (ends[run] - starts) * worth[run]
            best = int(np.argmax(np.where(valid, useful / cost, -np.inf)))
        if not valid.flat[best]:
            raise InternalError(f"no batch window among {len(lengths)} lengths")
        top, size = divmod(best, width)
        return Window(top, size + 1, float(cost.flat[best]))

    def _short(
        self,
        lengths: np.ndarray,
        ends: np.ndarray,
        starts: np.ndarray,
        sizes: np.ndarray,
        cost: np.ndarray,
        per_sequence: np.ndarray,
        valid: np.ndarray,
        oldest: int | None,
    ) -> int:
        """Everything pending fits one batch: the window (flat index) of the plan "it now, the rest as one
        batch after it" that costs least in all, or everything at once where that saves less than
        GROUPING_GAIN. Of plans within rounding of the least: the one whose window holds the oldest item,
        then the one that leaves the fewest waiting, then the cheaper window (a short group before a
        long one)."""
        n = int(ends[-1])
        rest = n - sizes
        # The rest's longest: the longest pending length, unless the window ends at it; then the length
        # of the sequence just below the window's start.
        last = len(lengths) - 1
        below = np.searchsorted(ends, np.maximum(starts - 1, 0), side="right")
        rest_longest = np.where(np.arange(len(lengths))[:, None] == last, below, last)
        rest_cost = np.where(
            rest > 0, self.model.a + rest * per_sequence[np.minimum(rest_longest, last)], 0.0
        )
        total = np.where(valid, cost + rest_cost, np.inf)
        least = float(total.min())
        everything = valid & (rest == 0)
        if everything.any() and least >= (1 - GROUPING_GAIN) * float(total[everything][0]):
            return int(np.argmax(everything))
        near = total <= least + abs(least) * 1e-9
        if oldest is not None:
            holds = near & (np.arange(len(lengths))[:, None] >= oldest) & (starts < ends[oldest])
            if holds.any():
                near = holds
        size_of = np.broadcast_to(sizes, near.shape)
        near &= size_of == size_of[near].max()  # then the fewest left to wait
        return int(np.argmin(np.where(near, cost, np.inf)))

    def take(self, lengths: np.ndarray, counts: np.ndarray, window: Window) -> list[tuple[int, int]]:
        """The window as ``(length, how many)`` per length, from its top length down."""
        plan = []
        size = window.size
        for i in range(window.top, -1, -1):
            take = min(int(counts[i]), size)
            plan.append((int(lengths[i]), take))
            size -= take
            if size == 0:
                break
        return plan
