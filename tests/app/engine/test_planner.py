"""Limits: what one batch may hold (app/engine/planner.py)."""

import numpy as np
import pytest

from app.engine.costs import CostModel, Refitter
from app.engine.planner import Limits, Planner
from app.model.grid import ShapeGrid


def test_limits_bound_the_attention_and_name_the_largest_batches() -> None:
    limits = Limits(size=8, tokens=4096, attention=8 * 256 * 256)
    assert [limits.room(n) for n in (16, 256, 257, 362, 512, 5000)] == [8, 8, 7, 4, 2, 1]
    assert limits.allows(2, 512) and not limits.allows(3, 512)
    assert limits.largest(512) == [(8, 256), (2, 512)]
    assert Limits(size=8, tokens=4096).largest(512) == [(8, 512)]  # no attention bound: tokens alone
    planner = Planner(CostModel.constant(16), 8, 4096, 8 * 256 * 256)
    window = planner.choose(np.array([512]), np.array([6]))
    assert window.size == 2  # six of 512 pending, two a batch


def test_a_thrifty_window_is_the_cheapest_nearly_as_efficient_one_that_pays_what_is_asked() -> None:
    """Against every (top, size) window in plain Python: the most efficient's score, then of the windows
    within ``thrift`` of it, the cheapest whose useful work reaches ``least`` (none: the most useful)."""
    rng = np.random.default_rng(11)
    for model in (CostModel(0.005, 0.0, 0.001, 0.0), CostModel(0.003, 0.0, 0.000002, 0.0)):
        for _ in range(200):
            planner = Planner(model, 8, 4096)
            lengths = np.unique(rng.integers(3, 60, int(rng.integers(1, 8)))).astype(np.int64)
            counts = rng.integers(1, 6, len(lengths)).astype(np.int64)
            least = float(rng.uniform(0, 0.2))
            ordered = [int(n) for n, c in zip(lengths, counts, strict=True) for _ in range(int(c))]
            ends = np.cumsum(counts)
            windows = []  # (cost, score, useful) of each window
            for top in range(len(lengths)):
                for k in range(1, min(8, int(ends[top])) + 1):
                    sequences = ordered[int(ends[top]) - k : int(ends[top])]
                    useful = float(planner.worth(np.array(sequences)).sum())
                    cost = model.cost(k, int(lengths[top]))
                    windows.append((cost, useful / cost, useful))
            best = max(score for _, score, _ in windows)
            good = [w for w in windows if w[1] >= 0.8 * best - 1e-12]
            enough = [w for w in good if w[2] >= least] or [max(good, key=lambda w: w[2])]
            want = min(w[0] for w in enough)
            window = planner.choose(lengths, counts, thrift=0.8, least=least)
            assert window.cost == pytest.approx(want)
            assert window.efficiency >= 0.8 * best - 1e-9


def test_on_the_grid_a_window_costs_its_grid_shape() -> None:
    """Padding charged through the cost model: a window of 5 sequences of at most 20 tokens costs a batch
    of 8 of 32, and the planner's every window agrees with the model's own cost."""
    grid = ShapeGrid(max_rows=8, max_length=128)
    model = CostModel(0.002, 0.0001, 0.00002, 1e-8).on_grid(grid)
    assert model.cost(5, 20) == CostModel(0.002, 0.0001, 0.00002, 1e-8).cost(8, 32)
    planner = Planner(model, 8, 4096)
    lengths, counts = np.array([3, 20, 40]), np.array([2, 3, 4])
    for top in range(len(lengths)):
        window = planner.choose(lengths[: top + 1], counts[: top + 1], anchor=top)
        assert window.cost == pytest.approx(model.cost(window.size, int(lengths[window.top])))
    # Five of 17 pending: exact shapes run all five; on the grid five are charged 8 rows, and four (a grid
    # shape of their own) do more useful work per second.
    assert (
        Planner(CostModel(0.002, 0.0001, 0.00002, 1e-8), 8, 4096).choose(np.array([17]), np.array([5])).size
        == 5
    )
    assert planner.choose(np.array([17]), np.array([5])).size == 4
    # The worth of a length is what it costs in a full grid batch: 8 of 40 tokens, padded to 48.
    assert planner.worth(np.array([40]))[0] == pytest.approx(model.cost(8, 48) / 8)


def test_the_refit_learns_from_the_shape_that_ran() -> None:
    grid = ShapeGrid(max_rows=8, max_length=128)
    model = CostModel(0.002, 0.0, 0.0001, 0.0, points=((1, 16, 0.0036), (8, 64, 0.0532), (4, 32, 0.0148)))
    refitter = Refitter(model.on_grid(grid))
    for _ in range(Refitter.EVERY - 1):
        refitter.add(5, 20, model.cost(8, 32))  # what a batch of 5 × 20 padded to 8 × 32 takes
    refitted = refitter.add(5, 20, model.cost(8, 32))
    assert refitted is not None and refitted.grid is grid and refitted.served_error == pytest.approx(0.0)
