"""loadtest.harness.report: a row's figures from its measured cell, and when its rate is noise."""

from __future__ import annotations

import math

import pytest

from loadtest.harness.cell import Cell
from loadtest.harness.measure import BATCH_COUNT, BATCH_SUM, INFERENCE_CPU, INFERENCE_SUM, Measured
from loadtest.harness.report import Row, target
from loadtest.loadgen import CellResult


def _cell(latency_ms: float, wall_s: float, requests: int = 10) -> CellResult:
    return CellResult(
        wall_s=wall_s,
        requests=requests,
        sentences=16 * requests,
        errors=0,
        latencies_ms=[latency_ms] * requests,
        client_cpu_s=0.1,
        status_counts={200: requests} if requests else {},
    )


def _row(load: CellResult, after: dict[str, float] | None = None) -> Row:
    return Row.of(Measured(Cell(8, 16), load, 2.0, 12.0, {}, after or {}))


def test_a_row_whose_requests_outlast_a_third_of_the_window_is_marked_unreliable() -> None:
    slow = _row(_cell(latency_ms=4000, wall_s=10))
    fast = _row(_cell(latency_ms=200, wall_s=10))
    none = _row(_cell(latency_ms=0, wall_s=10, requests=0))
    assert "UNRELIABLE" in slow.note and "UNRELIABLE" not in fast.note
    assert "no request ended" in none.note


def test_the_server_figures_are_per_input_it_computed_over_the_whole_cell() -> None:
    after = {BATCH_SUM: 1000.0, BATCH_COUNT: 125.0, INFERENCE_CPU: 0.5, INFERENCE_SUM: 6.0}
    row = _row(_cell(latency_ms=200, wall_s=10), after)
    assert row.label == "8x16" and row.status_counts == {"200": 10}
    assert row.mean_batch == 8.0 and row.server_cores == pytest.approx(2.0 / 12.0)
    assert row.cpu_us == pytest.approx(2000.0) and row.run_us == pytest.approx(500.0)
    assert row.outside_us == pytest.approx(1500.0) and math.isnan(row.machinery_us)  # no floor measured
    assert row.busy == pytest.approx(0.5)
    json = row.as_json()
    assert json["outside_us_per_sentence"] == pytest.approx(1500.0) and json["busy"] == pytest.approx(0.5)
    assert math.isnan(_row(_cell(200, 10)).mean_batch)  # no /metrics read


def test_a_target_line_says_pass_miss_or_not_judged() -> None:
    assert target("x >= 1", True, "2") == "  [PASS] x >= 1: 2"
    assert target("x >= 1", False, "0") == "  [MISS] x >= 1: 0"
    assert target("x >= 1", None, "not run") == "  [n/a ] x >= 1: not run"
