"""The planner simulation: closed-loop clients on a simulated clock, with the real planner."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.costs import CostModel
from loadtest.planner_sim import POLICIES, simulate

LENGTHS = np.array([8, 12, 14, 20, 20, 25, 30, 44, 60, 90])


def test_on_a_cpu_grouping_lengths_serves_more_than_one_batch_of_everything() -> None:
    cpu = CostModel(0.0081, 0.0, 0.00133, 0.0)  # 2 AVX2 cores: a batch costs about its tokens
    runs = {p: simulate(cpu, LENGTHS, 8, 0.2, 0.003, 400, policy=p) for p in POLICIES}
    assert runs["planner"][0] > runs["everything at once"][0] > 0
    assert runs["least in all"][0] > 0
    assert all(p99 >= p50 > 0 for _, p50, p99 in runs.values())


def test_on_a_gpu_like_device_everything_runs_together() -> None:
    gpu = CostModel(0.003, 0.0, 0.000002, 0.0)
    rate, p50, _ = simulate(gpu, LENGTHS, clients=8, budget_s=0.01, rtt_s=0.001, answers=400)
    # One batch of all 8 per round trip: about 8 answers per (batch + round trip).
    assert rate == pytest.approx(8 / (gpu.cost(8, 90) + 0.001), rel=0.3)
    assert p50 < 2 * (gpu.cost(8, 90) + 0.001)
