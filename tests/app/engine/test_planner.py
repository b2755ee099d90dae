"""Limits: what one batch may hold (app/engine/planner.py)."""

import numpy as np

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
