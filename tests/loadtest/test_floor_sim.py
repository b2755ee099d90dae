"""Background's floor on a simulated clock: the real batch queue under closed-loop clients."""

from __future__ import annotations

import numpy as np

from app.engine.costs import CostModel
from loadtest.floor_sim import simulate

LENGTHS = np.array([8, 12, 14, 20, 20, 25, 30, 44, 60, 90])
CPU = CostModel(0.0081, 0.0, 0.00133, 0.0)  # 2 AVX2 cores: a batch costs about its tokens


def test_beside_saturating_interactive_work_background_finishes_requests_at_its_floor() -> None:
    alone = simulate(CPU, LENGTHS, 8, (0, 1), 60.0)
    mixed = simulate(CPU, LENGTHS, 8, (64, 32), 60.0)
    assert alone.background_done == 0 and alone.interactive_per_s > 0
    assert mixed.background_share >= 0.095  # the setting's 0.1, less at most one full batch in 60 s
    assert mixed.background_done >= 3  # whole requests of 32 texts, not 64 of them crawling
    assert mixed.p99 <= 1.5 * alone.p99
