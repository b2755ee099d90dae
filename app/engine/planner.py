"""Which batch to run next: of the windows of the length-sorted pending sequences, the most efficient (its
sequences' worth, what they would cost in the best batches they could be in, over its cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.costs import CostModel
from app.errors import InternalError


@dataclass(frozen=True)
class Limits:
    """What one batch may hold: ``size`` inputs, ``tokens`` (size × longest, padding included) and
    ``attention`` (size × longest², 0: no bound). The attention's scores bound its memory: at 8 × 512 they
    are 100 MB a layer's softmax (fp32, 12 heads), four times 8 × 256's (docs/deployment.md)."""

    size: int
    tokens: int
    attention: int = 0

    def rooms(self, lengths: np.ndarray) -> np.ndarray:
        """How many sequences of each length one batch may hold (at least one)."""
        longest = np.maximum(lengths, 1)
        room = np.minimum(self.size, self.tokens // longest)
        if self.attention > 0:
            room = np.minimum(room, self.attention // (longest * longest))
        return np.maximum(room, 1)

    def room(self, length: int) -> int:
        return int(self.rooms(np.array([length]))[0])

    def allows(self, size: int, length: int) -> bool:
        return size <= self.room(length)

    def largest(self, max_length: int) -> list[tuple[int, int]]:
        """The batch shapes (size, length) that hold the most memory: the longest batch of the most inputs,
        and the longest batch there may be (buffers grow with size × length and size × length²)."""
        lengths = np.arange(1, max_length + 1)
        full = int(lengths[self.rooms(lengths) == self.size].max(initial=1))  # the longest full batch
        shapes = {(self.room(full), full), (self.room(max_length), max_length)}
        return sorted(shapes, key=lambda shape: (shape[1], shape[0]))


@dataclass(frozen=True)
class Window:
    """``size`` sequences with the longest at ``lengths[top]``; its cost and useful work (model's unit)."""

    top: int
    size: int
    cost: float
    useful: float = 0.0

    @property
    def efficiency(self) -> float:
        """The share of its cost that is useful work (about 1 at best), comparable across models."""
        return self.useful / self.cost if self.cost > 0 else 0.0


class Planner:
    def __init__(
        self, model: CostModel, max_batch_size: int, max_batch_tokens: int, max_batch_attention: int = 0
    ) -> None:
        self.model = model
        self.limits = Limits(max_batch_size, max_batch_tokens, max_batch_attention)
        self._sizes = np.arange(1, max_batch_size + 1)[None, :]
        # What a window of each size is charged for: on the grid, its grid rows (the padding rows).
        self._charged = self._sizes if model.grid is None else model.grid.rows_of(self._sizes)
        # Per length 0, 1, 2, …: what a sequence adds to a batch, how many one batch may hold, and its
        # worth; looked up, not computed, per plan (a plan is a few dozen numpy calls on small arrays,
        # each a microsecond or more), and grown when a longer length comes.
        self._per = self._fit = self._worth = np.zeros(0)
        self._grow(512)

    def _grow(self, longest: int) -> None:
        lengths = np.arange(max(longest + 1, 2 * len(self._per)))
        self._per = self.model.per_sequence(lengths)
        self._fit = self.limits.rooms(lengths)
        # On the grid a full batch of ``fit`` is charged its grid rows (1 when there is none: exactly).
        padded = 1.0 if self.model.grid is None else self.model.grid.rows_of(self._fit) / self._fit
        self._worth = self.model.a / self._fit + self._per * padded

    def worth(self, lengths: np.ndarray) -> np.ndarray:
        """What a sequence of each length costs in the best batch the limits allow it."""
        if int(lengths.max()) >= len(self._worth):
            self._grow(int(lengths.max()))
        return self._worth[lengths]

    def full_batch_cost(self, length: float) -> float:
        size = self.limits.room(max(1, int(length)))
        return self.model.cost(size, round(length))

    def choose(
        self,
        lengths: np.ndarray,
        counts: np.ndarray,
        anchor: int | None = None,
        cap: float | None = None,
        thrift: float | None = None,
        least: float = 0.0,
    ) -> Window:
        """The most efficient window. ``anchor`` (an index into ``lengths``) must be in it; ``cap`` bounds its
        cost; ``thrift``: of the windows at least this share as efficient as the best, the cheapest whose
        useful work is at least ``least`` (none: the most useful), and of equal costs the more efficient."""
        if int(lengths[-1]) >= len(self._per):  # lengths are sorted
            self._grow(int(lengths[-1]))
        ends = np.cumsum(counts)  # exclusive end of each length's run in the sorted sequence
        width = min(self.limits.size, int(ends[-1]))  # no window holds more than is pending
        sizes = self._sizes[:, :width]
        starts = ends[:, None] - sizes  # first sequence of each (top, size) window
        # Within what is pending, and within the token limit (a single sequence always fits).
        valid = (starts >= 0) & (sizes <= self._fit[lengths][:, None])
        starts = np.maximum(starts, 0)
        run = np.searchsorted(ends, starts, side="right")  # the length run each window starts in
        cost = self.model.a + self._charged[:, :width] * self._per[lengths][:, None]
        if cap is not None:
            valid &= (cost <= cap) | (sizes == 1)
        if anchor is not None:
            valid &= (np.arange(len(lengths))[:, None] >= anchor) & (starts < ends[anchor])
        worth = self._worth[lengths]
        total = np.cumsum(worth * counts)
        # Worth of every run after the starting one up to the top, and the starting run's share.
        useful = total[:, None] - total[run] + (ends[run] - starts) * worth[run]
        score = np.where(valid, useful / cost, -np.inf)
        best = int(np.argmax(score))
        if thrift is not None and valid.flat[best]:
            good = score >= thrift * score.flat[best]
            enough = good & (useful >= least)
            pool = enough if enough.any() else good & (useful == useful[good].max())
            cheapest = np.where(pool, cost, np.inf)
            best = int(np.argmax(np.where(cheapest == cheapest.min(), score, -np.inf)))
        if not valid.flat[best]:
            raise InternalError(f"no batch window among {len(lengths)} lengths")
        top, size = divmod(best, width)
        return Window(top, size + 1, float(cost.flat[best]), float(useful.flat[best]))

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
