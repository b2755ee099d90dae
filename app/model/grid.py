"""A bounded set of batch shapes: each batch padded to the grid shape above its (rows, longest).

On CUDA the first run of each new input shape cost ~37 ms and the same shape again 1.4 ms (the first GPU
run, docs/performance.md), and the service's batches are (rows, longest) pairs drawn from up to 256 × 512:
under real traffic most batches were first runs. On the grid a batch's length is rounded up to a multiple
of :data:`FINE_STEP` up to :data:`FINE_UNTIL` tokens and of :data:`COARSE_STEP` beyond (never past the
model's longest input), its rows up to a power of two (never past ``max_batch_size``): ~20 lengths × ~9
row counts, every one of them run once before ``/ready`` (:func:`warm_shapes`), so no batch in flight is
a first run. The planner charges each batch its grid shape's cost (:class:`app.engine.costs.CostModel`).

Padding never reaches an answer: :func:`fill` gives padding rows a valid mask ([CLS] [SEP], so mean
pooling divides by 2, not 0) and padding columns a zero mask, and the caller cuts the outputs back to the
batch's own rows and length (:mod:`app.model.shaped`) before anything reads them. The CPU keeps exact
shapes (``shape_grid`` auto): a CPU batch costs about its tokens, and padding would only add to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

GridChoice = Literal["auto", "on", "off"]

FINE_STEP = 16
FINE_UNTIL = 128
# Beyond 128 tokens a step of 32 keeps a batch's padding under 20% of its length (at 160) and the grid at
# 12 lengths more up to 512; a step of 64 would halve those at up to 33% padding.
COARSE_STEP = 32


def wanted(choice: GridChoice, provider: str) -> bool:
    """Whether batches go on the grid: ``auto`` on a GPU provider only (CUDA), else as set."""
    if choice == "auto":
        return provider == "CUDAExecutionProvider"
    return choice == "on"


@dataclass(frozen=True)
class ShapeGrid:
    """The grid shapes of batches of at most ``max_rows`` sequences of at most ``max_length`` tokens."""

    max_rows: int
    max_length: int

    def length(self, longest: int) -> int:
        """The grid length a batch whose longest sequence has ``longest`` tokens is padded to
        (:meth:`lengths_of`'s arithmetic on one int: per batch, numpy's per-call cost would be most of it)."""
        base, step = (0, FINE_STEP) if longest <= FINE_UNTIL else (FINE_UNTIL, COARSE_STEP)
        return min(base + -(-(longest - base) // step) * step, max(self.max_length, 1))

    def rows(self, rows: int) -> int:
        """The grid rows a batch of ``rows`` sequences is padded to (:meth:`rows_of` on one int)."""
        return min(1 << (max(rows, 1) - 1).bit_length(), self.max_rows)

    def shape(self, rows: int, longest: int) -> tuple[int, int]:
        return self.rows(rows), self.length(longest)

    def lengths_of(self, lengths: np.ndarray) -> np.ndarray:
        """:meth:`length` of each of ``lengths`` (0 stays 0: the planner's table starts there)."""
        n = lengths.astype(np.int64)
        fine = -(-n // FINE_STEP) * FINE_STEP
        coarse = FINE_UNTIL + -(-(n - FINE_UNTIL) // COARSE_STEP) * COARSE_STEP
        return np.minimum(np.where(n <= FINE_UNTIL, fine, coarse), max(self.max_length, 1))

    def rows_of(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`rows` of each of ``rows``: the next power of two, at most ``max_rows``."""
        n = np.maximum(rows.astype(np.int64), 1)
        power = np.left_shift(1, np.ceil(np.log2(n)).astype(np.int64))
        return np.minimum(power, self.max_rows)

    def lengths(self) -> list[int]:
        """Every grid length, shortest first."""
        return sorted({int(g) for g in self.lengths_of(np.arange(1, self.max_length + 1))})

    def row_counts(self) -> list[int]:
        """Every grid row count, fewest first."""
        return sorted({int(r) for r in self.rows_of(np.arange(1, self.max_rows + 1))})

    def size(self) -> int:
        """How many shapes the grid has, bounds aside."""
        return len(self.lengths()) * len(self.row_counts())


def warm_shapes(grid: ShapeGrid, room: Callable[[int], int]) -> list[tuple[int, int]]:
    """The grid shapes a batch within the limits can be padded to, cheapest first: for each grid length,
    the row counts of 1 up to as many sequences as the limits allow a batch (``room``) of the shortest
    length that pads to it. (A padded batch may hold more than the limits allow its own shape: 5 rows of
    room pad to 8.)"""
    shapes: set[tuple[int, int]] = set()
    previous = 0
    for length in grid.lengths():
        most = grid.rows(room(previous + 1))
        shapes.update((rows, length) for rows in grid.row_counts() if rows <= most)
        previous = length
    return sorted(shapes, key=lambda s: (s[0] * s[1], s[1]))


Buffers = tuple[np.ndarray, np.ndarray, np.ndarray]  # a grid shape's ids, mask and token types


def buffers(shape: tuple[int, int]) -> Buffers:
    """A grid shape's input buffers, zeroed (:func:`fill` writes a batch into them)."""
    return np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)


def fill(
    into: Buffers,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    token_type_ids: np.ndarray | None,
    ends: tuple[int, int, int],
) -> None:
    """Write a batch into a grid shape's buffers (ids, mask, token types), in place.

    The batch fills the top-left corner; padding columns get ``pad`` ids and a zero mask; each padding row
    is ``[CLS] [SEP]`` with a mask of two (``ends`` is (cls, sep, pad)): a valid sequence, so that no
    pooling divides by an empty mask, whose vectors the caller drops.
    """
    ids, mask, types = into
    cls_id, sep_id, pad_id = ends
    rows, length = input_ids.shape
    ids[:rows, :length] = input_ids
    ids[:rows, length:] = pad_id
    mask[:rows, :length] = attention_mask
    mask[:rows, length:] = 0
    types[:rows, :length] = token_type_ids if token_type_ids is not None else 0
    types[:rows, length:] = 0
    if rows < len(ids):
        ids[rows:] = pad_id
        mask[rows:] = 0
        types[rows:] = 0
        ids[rows:, 0] = cls_id
        mask[rows:, 0] = 1
        if ids.shape[1] > 1:
            ids[rows:, 1] = sep_id
            mask[rows:, 1] = 1
