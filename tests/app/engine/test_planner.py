"""Limits: what one batch may hold (app/engine/planner.py)."""

import numpy as np
import pytest

from app.engine.costs import CostModel
from app.engine.planner import Limits, Planner


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
