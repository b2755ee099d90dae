"""``python -m loadtest.bench --quick`` runs end to end (tiny model, real service, real baseline), so the
harness never rots. Speed targets live in the harness, never here: this asserts only that every row was
measured and nothing failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench import summary
from loadtest.raw_onnx import BertShape
from tests.loadtest.conftest import run_module

EXPECTED = [
    "raw fp32 best b=",
    "raw int8 best b=",
    "service c=1 x1",
    "service c=8 x1",
    "service c=1 x4",
    "service c=8 x4",
    "naive c=1 x1",
    "naive c=8 x4",
    "cache 100% hit",
    "cache 0% hit",
]


@pytest.mark.slow  # exports a tiny model and starts three servers: ~50 s on 2 cores
def test_quick_bench_measures_every_row_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    stdout = run_module("loadtest.bench", "--quick", "--out", str(out), timeout=600)
    rows = json.loads(out.read_text())["rows"]
    labels = [r["label"] for r in rows]
    for prefix in EXPECTED:
        assert any(label.startswith(prefix) for label in labels), f"no {prefix!r} row in {labels}"
    for row in rows:
        if row["kind"] == "cache" and row["sentences_per_s"] is None:
            assert row["note"].startswith("n/a (no cache)"), row
            continue
        assert row["errors"] == 0, row
        assert row["sentences_per_s"] > 0, row
    printed = stdout
    for prefix in EXPECTED:
        assert prefix in printed


def test_the_summary_gives_the_memory_of_the_whole_tree_and_each_process() -> None:
    def reading(*mib: tuple[str, int, int]) -> dict[str, object]:
        """A procs.Tree.as_json() of (role, RSS MiB, PSS MiB) processes."""
        return {
            "rss": sum(rss for _, rss, _ in mib) * 2**20,
            "pss": sum(pss for _, _, pss in mib) * 2**20,
            "peak_rss": 0,
            "processes": [
                {"pid": i, "role": role, "rss": rss * 2**20, "pss": pss * 2**20}
                for i, (role, rss, pss) in enumerate(mib)
            ],
        }

    start = reading(("supervisor", 90, 60), ("worker", 250, 220), ("worker", 250, 220))
    steady = reading(("supervisor", 90, 60), ("worker", 380, 350), ("worker", 390, 360))
    facts = {"memory_after_start": start, "memory_steady": steady, "model_bytes": 100 * 2**20}
    peaks = {"fp32": 1e9, "int8": 1e9}
    text = "\n".join(summary([], facts, peaks, BertShape(2, 64, 128), "int8", 0, 1.0))
    assert "590 MiB after start, 860 MiB steady" in text and "PSS (shared pages once) 500 / 770 MiB" in text
    assert "worker 2: RSS 390 MiB, PSS 360 MiB steady" in text
    assert "[MISS] RSS <= 1.5 x model + cache budget: 860 MiB vs 150 MiB" in text
