"""What one batch costs on this machine: ``a + B·(b + c·S + d·S²)`` seconds for B sequences padded to S
tokens, fitted (every coefficient ≥ 0) on the relative error over a measured grid, then refitted from the
batches served: no constant is right on both a CPU (a batch costs about its tokens) and a GPU (about a
fixed launch time). With ``measure_batch_cost`` off it is :meth:`CostModel.constant`, in tokens.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from app.model.grid import ShapeGrid

SCHEMA = 1  # of the cached JSON (:meth:`CostModel.to_json`)
# Seconds the grid may take on this machine, in all. On 2 AVX2 cores the bert-base int8 graph costs
# ~1.3 ms a token: the grid then reaches 256 tokens a batch; a GPU measures all of it in well under this.
MEASURE_BUDGET_S = 3.0
LENGTHS = (8, 16, 32, 64, 128, 256, 512)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# The S² term (attention) is fitted only from a grid that reaches this length: below it attention is a
# few percent of a BERT layer, and a fit over short lengths puts the measurements' noise into it.
ATTENTION_FROM = 128

Runner = Callable[[int, int], float]  # (batch size, sequence length) → seconds of one run


@dataclass(frozen=True)
class CostModel:
    """``a + B·(b + c·S + d·S²)`` seconds (or tokens, the constant): ``a`` per batch (a session run, kernel
    launches), ``b`` per sequence, ``c`` per token (the GEMMs), ``d`` per token per token (attention)."""

    a: float
    b: float
    c: float
    d: float
    unit: str = "s"
    source: str = "measured"
    # (batch size, length, measured seconds) of each grid point; empty for the constant.
    points: tuple[tuple[int, int, float], ...] = ()
    key: dict[str, str] = field(default_factory=dict)
    measured_s: float = 0.0  # how long the grid took when it was measured
    served: int = 0  # batches served since start-up that the coefficients were refitted from
    served_error: float | None = None  # moving mean |predicted / ran - 1| of the served batches
    # Batches padded to a grid of shapes (app/model/grid.py) cost their grid shape's: None, their own.
    grid: ShapeGrid | None = None

    @classmethod
    def constant(cls, overhead_tokens: int, why: str = "measure_batch_cost off") -> CostModel:
        return cls(float(overhead_tokens), 0.0, 1.0, 0.0, "tokens", f"batch_overhead_tokens ({why})")

    @property
    def measured(self) -> bool:
        return self.unit == "s"

    def on_grid(self, grid: ShapeGrid | None) -> CostModel:
        return replace(self, grid=grid)

    def shape(self, size: int, length: int) -> tuple[int, int]:
        """The shape a batch runs at: on the grid, its grid shape."""
        return (size, length) if self.grid is None else self.grid.shape(size, length)

    def per_sequence(self, lengths: np.ndarray) -> np.ndarray:
        """What each sequence of a batch padded to ``lengths`` adds: ``b + c·S + d·S²``."""
        s = (lengths if self.grid is None else self.grid.lengths_of(lengths)).astype(np.float64)
        return self.b + s * (self.c + self.d * s)

    def cost(self, size: int, length: int) -> float:
        size, length = self.shape(size, length)
        return self.a + size * (self.b + length * (self.c + self.d * length))

    def errors(self) -> np.ndarray:
        """Relative error of the fit at each grid point (fitted / measured − 1)."""
        return np.array([self.cost(b, s) / t - 1 for b, s, t in self.points])

    def describe(self) -> dict[str, Any]:
        """What /info shows."""
        scale, unit = (1e3, "ms") if self.measured else (1.0, "tokens")
        errors = np.abs(self.errors())
        return {
            "formula": "a + B*(b + c*S + d*S^2) for B sequences padded to S tokens",
            "unit": unit,
            **{k: round(getattr(self, k) * scale, 9 if k == "d" else 6) for k in "abcd"},
            "source": self.source,
            "key": self.key,
            "grid": [
                {"B": b, "S": s, "measured": round(t * scale, 3), "fitted": round(self.cost(b, s) * scale, 3)}
                for b, s, t in self.points
            ],
            "max_error": round(float(errors.max()), 4) if errors.size else None,
            "mean_error": round(float(errors.mean()), 4) if errors.size else None,
            "measured_s": round(self.measured_s, 3),
            "refitted_from_served_batches": self.served,
            "served_error": round(self.served_error, 4) if self.served_error is not None else None,
            "charged": "each batch's shape" if self.grid is None else "each batch's grid shape (shape_grid)",
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "key": self.key,
            "coefficients": [self.a, self.b, self.c, self.d],
            "points": [list(p) for p in self.points],
            "measured_s": self.measured_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> CostModel:
        a, b, c, d = (float(x) for x in data["coefficients"])
        points = tuple((int(p[0]), int(p[1]), float(p[2])) for p in data["points"])
        return cls(a, b, c, d, "s", source, points, dict(data["key"]), float(data.get("measured_s", 0.0)))


def _rows(points: np.ndarray) -> np.ndarray:
    """The four terms of each (B, S, seconds) over its seconds: least squares on them is on relative error."""
    sizes, lengths, seconds = points.reshape(-1, 3).T
    terms = np.stack([np.ones_like(sizes), sizes, sizes * lengths, sizes * lengths**2], axis=-1)
    return terms / seconds[..., None]


def _solve(gram: np.ndarray, moment: np.ndarray, attention: bool) -> tuple[float, float, float, float]:
    """Least squares from the normal equations (RᵀR, Rᵀ1), every coefficient ≥ 0 (a negative one would make
    some batch cost less than nothing): else the best fit of a subset of the terms. No attention: d = 0."""
    terms = 4 if attention else 3
    fits: list[np.ndarray] = []
    for columns in [list(c) for n in range(terms, 0, -1) for c in itertools.combinations(range(terms), n)]:
        try:
            solution = np.linalg.solve(gram[np.ix_(columns, columns)], moment[columns])
        except np.linalg.LinAlgError:  # a term the points cannot tell from the others
            continue
        if not (solution < 0).any():
            fits.append(np.zeros(4))
            fits[-1][columns] = solution
            if len(columns) == terms:  # the usual case: no subset fits better
                break
    if not fits:
        raise ValueError("no non-negative fit of the batch costs")
    # The least squared residual, less the constant Σ1²: -2·xᵀm + xᵀGx.
    a, b, c, d = (float(x) for x in min(fits, key=lambda x: float(x @ gram @ x - 2 * x @ moment)))
    return a, b, c, d


def fit(points: list[tuple[int, int, float]]) -> tuple[float, float, float, float]:
    """``(a, b, c, d)`` ≥ 0 minimising the squared relative error over ``points`` (B, S, seconds)."""
    rows = _rows(np.array(points, dtype=np.float64))
    return _solve(rows.T @ rows, rows.sum(axis=0), any(s >= ATTENTION_FROM for _, s, _ in points))


class Refitter:
    """Refits a measured model from the batches served, beside the event loop and the tokeniser (on 2 CPU
    cores ``a`` came out about twice the quiet grid's). The grid's points keep :data:`GRID_WEIGHT` batches'
    worth, so a term the served batches do not vary keeps the grid's value; served batches fade by half
    every :data:`HALF_LIFE` batches."""

    GRID_WEIGHT = 4.0
    HALF_LIFE = 200
    EVERY = 32

    def __init__(self, model: CostModel) -> None:
        self.model = model
        rows = _rows(np.array(model.points, dtype=np.float64))
        weight = self.GRID_WEIGHT / max(len(rows), 1)
        self._prior = (weight * rows.T @ rows, weight * rows.sum(axis=0))
        self._attention = any(s >= ATTENTION_FROM for _, s, _ in model.points)
        self._gram, self._moment = np.zeros((4, 4)), np.zeros(4)  # the served batches' sums, faded
        self._keep = 0.5 ** (1 / self.HALF_LIFE)
        # The batches since the last refit, (B, S, seconds), folded in at the refit in one numpy pass (per
        # batch, numpy's per-call cost was most of what the refit cost the inference thread).
        self._pending: list[tuple[float, float, float]] = []
        self._served = 0
        self._error: float | None = None

    def add(self, size: int, length: int, seconds: float) -> CostModel | None:
        """One served batch; a refitted model every :data:`EVERY` batches (None in between)."""
        if seconds <= 0:
            return None
        size, length = self.model.shape(size, length)  # what ran: on the grid, the padded shape
        miss = abs(self.model.cost(size, length) / seconds - 1)
        self._error = miss if self._error is None else self._error + 0.05 * (miss - self._error)
        self._pending.append((float(size), float(length), seconds))
        self._served += 1
        if self._served % self.EVERY:
            return None
        # Fold the pending batches into the sums, each faded by _keep per batch served after it.
        rows = _rows(np.array(self._pending))
        self._pending.clear()
        weights = self._keep ** np.arange(len(rows) - 1, -1, -1, dtype=np.float64)
        fade = self._keep ** len(rows)
        self._gram = fade * self._gram + (rows * weights[:, None]).T @ rows
        self._moment = fade * self._moment + weights @ rows
        a, b, c, d = _solve(self._prior[0] + self._gram, self._prior[1] + self._moment, self._attention)
        self.model = replace(self.model, a=a, b=b, c=c, d=d, served=self._served, served_error=self._error)
        return self.model


def grid(max_size: int, max_tokens: int, max_length: int, max_attention: int = 0) -> list[tuple[int, int]]:
    """The (batch size, length) points to time, cheapest first, within the batch limits."""
    sizes = sorted({s for s in SIZES if s <= max_size} | {max_size})
    lengths = sorted({n for n in LENGTHS if n <= max_length} | {min(max_length, LENGTHS[0])})
    most = max_attention if max_attention > 0 else float("inf")
    points = [(b, s) for b in sizes for s in lengths if b == 1 or (b * s <= max_tokens and b * s * s <= most)]
    return sorted(points, key=lambda p: (p[0] * p[1], p[1]))


def enough(points: Sequence[tuple[float, ...]]) -> bool:
    """Whether ``points`` can pin down all four terms: three lengths (for S²) and two sizes (for a)."""
    return len({p[1] for p in points}) >= 3 and len({p[0] for p in points}) >= 2 and len(points) >= 5


def measure(
    run: Runner,
    points: list[tuple[int, int]],
    budget_s: float = MEASURE_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, int, float]]:
    """Time ``run`` at ``points`` once each while that takes a third of ``budget_s`` (and until they are
    :func:`enough`), then in rounds over them, keeping each point's cheapest run: a burst of other work on
    a shared machine then slows one run of each point, not every run of some."""
    best: dict[tuple[int, int], float] = {}
    started = clock()
    per_token = 0.0
    for size, length in points:
        if best and clock() - started + per_token * size * length > budget_s / 3 and enough(list(best)):
            break
        best[(size, length)] = seconds = run(size, length)
        per_token = max(per_token, seconds / (size * length))
    while clock() - started + sum(best.values()) <= budget_s:
        for point in best:
            best[point] = min(best[point], run(*point))
    return [(size, length, seconds) for (size, length), seconds in best.items()]
