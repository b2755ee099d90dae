"""``python -m loadtest.engine_path`` runs the service and engine in-process on a tiny model, no HTTP."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.loadtest.conftest import run_module


@pytest.mark.slow  # exports a 4-layer tiny model: ~15 s on 2 cores
def test_each_cell_splits_the_cpu_into_the_model_and_the_rest(tmp_path: Path) -> None:
    stdout = run_module(
        "loadtest.engine_path", "--model", str(tmp_path / "model"), "--cells", "4x8,8x1", "--seconds", "1"
    )
    for label in ("4x8", "8x1"):
        row = re.search(rf"^{label}\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(.*)$", stdout, re.M)
        assert row is not None, stdout
        rate, batch, total, in_run, outside = (float(row[k]) for k in range(1, 6))
        assert rate > 0 and batch >= 1 and in_run > 0
        assert total == pytest.approx(in_run + outside, abs=1.5)  # each rounded on its own
        assert "zhembed-inference:" in row[6]  # the inference thread's CPU, by name
