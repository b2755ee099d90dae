"""``python -m loadtest.scheduler --quick`` runs end to end (tiny model, real service, every cell, both raw
passes), so the harness never rots. The targets are the harness's PASS / MISS lines, never asserted here:
this checks that every cell was measured, nothing failed, and the urgencies were counted apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.harness.report import Row
from loadtest.scheduler import summarise, summarise_floor
from tests.loadtest.conftest import run_module

CELLS = [
    "ours 8x1 (1)",
    "ours 32x1",
    "ours 8x16",
    "background alone",
    "background mixed",
    "interactive mixed",
]


@pytest.mark.slow  # exports a tiny model and starts the service: ~60 s on 2 cores
def test_quick_scheduler_measures_every_cell_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "scheduler.json"
    stdout = run_module("loadtest.scheduler", "--quick", "--out", str(out), timeout=600)
    report = json.loads(out.read_text())
    cells = report["cells"]
    for name in CELLS:
        assert cells[name]["errors"] == 0, cells[name]
        if name == "background mixed":
            # Beside interactive work it runs only in the room of interactive batches until it has aged
            # past them (4 s at u=7, longer than the quick window): on a busy machine, none at all.
            continue
        assert cells[name]["requests"] > 0, cells[name]
        assert cells[name]["sentences_per_s"] > 0, cells[name]  # counted by the server, by urgency
    assert report["cost_model"]["cost_model"]["unit"] == "ms"  # the service measured its batch cost
    assert set(report["raw_start"]) == set(report["raw_end"]) == {"8", "32"}
    assert "| interactive 8x1 p99 beside background vs idle" in stdout


def test_the_summary_holds_each_target_against_its_own_reference() -> None:
    def cell(name: str, rate: float, p50: float = 10.0, p99: float = 15.0) -> Row:
        return Row(name, clients=8, texts=1, sentences_per_s=rate, p50_ms=p50, p99_ms=p99)

    cells = {
        "ours 8x1 (1)": cell("a", 100, p99=14),
        "ours 8x1 (2)": cell("b", 100, p99=16),
        "today 8x1 (1)": cell("c", 90),
        "today 8x1 (2)": cell("d", 100),
        "ours 32x1": cell("e", 190),
        "ours 8x16": cell("f", 200),
        "background alone": cell("g", 100),
        "background mixed": cell("h", 69),
        "interactive mixed": cell("i", 50, p99=22.6),
    }
    rows = {
        r["what"].split(" vs ")[0]: r for r in summarise(cells, {8: 180, 32: 200}, {8: 180, 32: 200}, True)
    }
    assert rows["32x1 sentences/s"]["ratio"] == pytest.approx(0.95) and rows["32x1 sentences/s"]["ok"]
    assert rows["8x16 sentences/s"]["ok"]
    assert rows["8x1 p99 / p50 (rounds 1, 2)"]["ratio"] == pytest.approx(1.5)
    assert rows["8x1 sentences/s"]["ratio"] == pytest.approx(100 / 95) and rows["8x1 sentences/s"]["ok"]
    assert rows["interactive 8x1 p99 beside background"]["ratio"] == pytest.approx(22.6 / 15)
    assert not rows["interactive 8x1 p99 beside background"]["ok"]  # 1.51 > 1.5
    assert not rows["background sentences/s beside interactive"]["ok"]  # 0.69 < 0.7


def test_the_floor_summary_holds_whole_requests_to_the_share_of_capacity_and_the_p99_to_alone() -> None:
    def cell(rate: float, requests: int = 10, p99: float = 15.0) -> Row:
        row = Row("x", clients=8, texts=1, sentences_per_s=rate, p50_ms=10.0, p99_ms=p99, requests=requests)
        row.extra["client_sentences_per_s"] = rate
        return row

    cells = {
        "ours interactive alone (1)": cell(100, p99=19),
        "ours interactive alone (2)": cell(100, p99=21),
        "ours background alone": cell(200),
        "ours background mixed": cell(19.8, requests=3),
        "ours interactive mixed": cell(90, p99=29),
    }
    rows = {r["what"].split(": ")[1].split(" beside")[0]: r for r in summarise_floor(cells, "ours")}
    assert rows["background whole-request sent/s"]["ratio"] == pytest.approx(0.099)
    assert not rows["background whole-request sent/s"]["ok"]  # 0.099 < 0.10 of its capacity
    assert rows["background requests finished"]["ok"]
    assert rows["interactive p99"]["ratio"] == pytest.approx(1.45) and rows["interactive p99"]["ok"]
    cells["ours background mixed"] = cell(30, requests=0)
    rows = {r["what"].split(": ")[1].split(" beside")[0]: r for r in summarise_floor(cells, "ours")}
    assert not rows["background requests finished"]["ok"]  # inputs computed, but no request whole
