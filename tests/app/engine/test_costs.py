"""The batch cost model: the fit recovers what it is given, the grid stays within the limits and the time
budget, and the model follows what the served batches cost."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import costs
from app.engine.costs import CostModel, Refitter, fit, grid, measure

TRUE = (0.004, 0.0002, 0.0011, 0.000003)  # a, b, c, d in seconds


def synthetic(size: int, length: int) -> float:
    a, b, c, d = TRUE
    return a + size * (b + c * length + d * length**2)


def test_the_fit_recovers_the_coefficients_it_was_given() -> None:
    points = [(b, s, synthetic(b, s)) for b, s in grid(8, 4096, 512)]
    assert fit(points) == pytest.approx(TRUE, rel=1e-6)


def test_the_fit_is_never_negative_and_its_error_is_reported() -> None:
    rng = np.random.default_rng(1)
    # A GPU-like device: a large fixed cost, almost nothing per token; noisy measurements.
    points = [(b, s, (0.003 + 2e-7 * b * s) * rng.uniform(0.9, 1.1)) for b, s in grid(256, 32768, 512)]
    a, b, c, d = fit(points)
    assert min(a, b, c, d) >= 0 and a == pytest.approx(0.003, rel=0.15)
    model = CostModel(a, b, c, d, points=tuple(points))
    described = model.describe()
    assert described["unit"] == "ms" and 0 < described["max_error"] < 0.2
    assert len(described["grid"]) == len(points)


def test_the_grid_keeps_to_the_batch_limits_cheapest_first() -> None:
    points = grid(8, 256, 128)
    assert all(b <= 8 and s <= 128 and (b * s <= 256 or b == 1) for b, s in points)
    assert (8, 32) in points and (8, 64) not in points and (1, 128) in points
    tokens = [b * s for b, s in points]
    assert tokens == sorted(tokens)


def test_measuring_keeps_to_its_time_budget_and_the_cheapest_run_of_each_point() -> None:
    clock = [0.0]
    calls: list[tuple[int, int]] = []

    def run(size: int, length: int) -> float:
        # A burst of other work on the machine triples each point's first run.
        seconds = synthetic(size, length) * (3 if (size, length) not in calls else 1)
        clock[0] += seconds
        calls.append((size, length))
        return seconds

    points = measure(run, grid(8, 4096, 512), budget_s=3.0, clock=lambda: clock[0])
    assert costs.enough(points) and len(points) < len(grid(8, 4096, 512))  # the budget cut it short
    assert clock[0] <= 3.0 + 3 * synthetic(8, 64)
    rounds = len(calls) / len(points)
    assert rounds == int(rounds) >= 2  # every point as often: rounds over them all
    assert all(seconds == synthetic(b, s) for b, s, seconds in points)  # the burst left no trace
    tiny = measure(run, grid(8, 4096, 512), budget_s=0.0, clock=lambda: clock[0])
    assert costs.enough(tiny)  # even with no time at all: enough for the four terms


def test_attention_is_fitted_only_from_long_enough_sequences() -> None:
    short = [(b, s, synthetic(b, s)) for b, s in grid(8, 4096, 64)]
    assert fit(short)[3] == 0.0  # the S² term is left out below 128 tokens
    long = [(b, s, synthetic(b, s)) for b, s in grid(8, 4096, 128)]
    assert fit(long)[3] == pytest.approx(TRUE[3], rel=1e-6)


def test_the_model_is_refitted_from_the_batches_served() -> None:
    quiet = [(b, s, synthetic(b, s)) for b, s in grid(8, 4096, 128)]
    model = CostModel(*fit(quiet), points=tuple(quiet))
    refitter = Refitter(model)
    rng = np.random.default_rng(2)
    refitted = None
    for _ in range(20 * Refitter.EVERY):
        # Serving: each batch pays 6 ms more than at start-up (the event loop and the tokeniser beside it).
        size, length = int(rng.integers(1, 9)), int(rng.integers(10, 80))
        refitted = refitter.add(size, length, synthetic(size, length) + 0.006) or refitted
    assert refitted is not None and refitted.served == 20 * Refitter.EVERY
    assert refitted.a == pytest.approx(TRUE[0] + 0.006, rel=0.1)
    assert refitted.c == pytest.approx(TRUE[2], rel=0.1)
    assert refitted.describe()["refitted_from_served_batches"] == refitted.served
    assert refitted.served_error is not None and refitted.served_error < 0.2


def test_what_the_served_batches_do_not_vary_keeps_the_grids_value() -> None:
    quiet = [(b, s, synthetic(b, s)) for b, s in grid(8, 4096, 128)]
    refitter = Refitter(CostModel(*fit(quiet), points=tuple(quiet)))
    refitted = None
    for _ in range(10 * Refitter.EVERY):  # every batch 8 × 30: nothing tells a from b and c
        refitted = refitter.add(8, 30, synthetic(8, 30)) or refitted
    assert refitted is not None
    for size, length in [(1, 8), (8, 30), (2, 120)]:
        assert refitted.cost(size, length) == pytest.approx(synthetic(size, length), rel=0.05)
