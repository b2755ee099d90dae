"""``loadtest/gpu_check.py`` has no GPU here; its CPU mode runs the same steps so the script cannot rot.
No timing thresholds: the targets live in the script's PASS/MISS lines, not here."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from loadtest.gpu_check import format_cell, over_budget, targets
from loadtest.harness.report import Row
from tests.loadtest.conftest import ROOT, run_module


@pytest.mark.slow  # starts the service twice (1 and 2 workers) on the tiny model's fp16 graph: ~30 s
def test_gpu_check_runs_every_cell_on_the_cpu_provider(tiny_model_dir: Path, tmp_path: Path) -> None:
    # 8 clients, not 256: with 256 a request outlasts a short window on 2 busy cores, so the cell counts
    # nothing or a phase artefact. 1.5 s windows are over 3x the 8x32 p50 here (~0.4 s).
    out, md, stage = tmp_path / "gpu-check.json", tmp_path / "gpu-check.md", tmp_path / "stage.json"
    stage.write_text('{"rows": 3}')
    cpu = [
        "--provider",
        "CPUExecutionProvider",
        "--clients",
        "8",
        "--workers",
        "1,2",
        "--worker-cells",
        "x32,1x1",
    ]
    short = ["--seconds", "1.5", "--warmup", "0.5", "--raw-seconds", "0.1"]
    more = ["--markdown", str(md), "--attach", f"probe={stage}", "--setting", "max_batch_size=128"]
    args = ["--model", str(tiny_model_dir), *cpu, *short, *more, "--out", str(out)]
    stdout = run_module("loadtest.gpu_check", *args)
    report = json.loads(out.read_text())
    assert report["probe"] == {"rows": 3}  # an attached stage rides in the report
    assert report["service_env"]["ZHEMBED_MAX_BATCH_SIZE"] == "128"  # --setting wins over GPU_LIKE's 256
    assert report["shape_grid"] == {"1": None, "2": None}  # the CPU's default: exact shapes
    assert "ready in" in stdout and "exact shapes (no grid)" in stdout
    page = md.read_text()
    assert "| 1x1 | 2 |" in page and re.search(
        r"^- \[(PASS|MISS)\] 8x32 >= 20,000 sentences/s", page, re.MULTILINE
    )
    assert report["parity_cosine_min"] > 0.99
    assert 0 <= report["batchings"]["pooled_max_abs"] < 1e-2  # fp16 rounding, not another text's vector
    assert report["raw_ceiling"]["batch"] == 256 and report["raw_ceiling"]["seq"] == 32
    assert report["raw_ceiling"]["sentences_per_s"] > 0
    ran = [(c["label"], c["workers"]) for c in report["cells"]]
    assert ran == [("8x32", 1), ("8x32 base64", 1), ("8x1", 1), ("1x1", 1), ("8x32", 2), ("1x1", 2)]
    for c in report["cells"]:
        assert c["errors"] == 0 and c["requests"] > 0, c
        assert c["status_counts"] == {"200": c["requests"]}, c
        assert c["workers_ready"] == c["workers"], c  # zhembed_workers_ready after the cell
        assert 1 <= c["mean_batch"] <= 128, c
        assert 0 < c["busy"] <= 1, c
        assert c["server_cores"] > 0, c
    for target in (
        r"8x32 >= 20,000 sentences/s: [\d,]+",
        r"8x32 >= 0.5 x raw ceiling: [\d.]+ \([\d,]+ / [\d,]+\)",
        r"8x32 float >= 0.85 x base64: [\d.]+ \([\d,]+ / [\d,]+\)",
        r"8x1 >= 5,000 requests/s: [\d,]+",
        r"1x1 p50 <= 2 ms: [\d.]+ ms",
        r"1x1 p99 <= 5 ms: [\d.]+ ms",
        *(rf"{label} p99 <= 3 x p50: [\d.]+" for label in ("8x32", "8x32 base64", "8x1", "1x1")),
    ):
        assert re.search(r"\[(PASS|MISS)\] " + target, stdout), (target, stdout[-2000:])
    assert re.search(r"8x32 by workers: 1: [\d,]+/s p50 [\d.]+ p99 [\d.]+ ms; 2: [\d,]+/s", stdout)
    assert re.search(r"1x1 by workers: 1: .*; 2: ", stdout)
    assert re.search(r"^total: \d+ s$", stdout, re.MULTILINE)


def _cell(label: str, sentences_per_s: float, p50_ms: float, p99_ms: float, client_cores: float = 0.3) -> Row:
    clients, texts = (int(x) for x in label.split()[0].split("x"))
    return Row(label, clients=clients, texts=texts, workers=4, workers_ready=4.0, sentences_per_s=sentences_per_s,
               requests_per_s=sentences_per_s / texts, p50_ms=p50_ms, p99_ms=p99_ms, errors=0, requests=100,
               status_counts={"200": 100}, mean_batch=64.0, client_cores=client_cores, wall_s=10.0)  # fmt: skip


def test_each_target_is_judged_on_its_own_cell_and_a_missing_cell_is_not_measured() -> None:
    main = {
        "256x32": _cell("256x32", 25_000.0, 300.0, 2500.0),
        "1x1": _cell("1x1", 400.0, 2.5, 12.0, client_cores=0.95),
    }
    lines = targets(main, 256, ceiling=60_000.0)
    assert "  [PASS] 256x32 >= 20,000 sentences/s: 25,000" in lines
    assert "  [MISS] 256x32 >= 0.5 x raw ceiling: 0.42 (25,000 / 60,000)" in lines
    assert "  [n/a ] 256x32 float >= 0.85 x base64: not measured" in lines  # no base64 cell
    assert "  [MISS] 256x32 p99 <= 3 x p50: 8.33" in lines
    assert "  [n/a ] 256x1 >= 5,000 requests/s: not measured" in lines
    assert "  [MISS] 1x1 p50 <= 2 ms: 2.50 ms (client at 0.95 cores: it may be the limit)" in lines
    assert "  [MISS] 1x1 p99 <= 5 ms: 12.00 ms (client at 0.95 cores: it may be the limit)" in lines
    assert "  [PASS] 1x1 p99 <= 3 x p50: 4.80 (client at 0.95 cores: it may be the limit)" not in lines
    assert "  [MISS] 1x1 p99 <= 3 x p50: 4.80 (client at 0.95 cores: it may be the limit)" in lines


def test_the_float_cell_is_judged_against_the_base64_cell() -> None:
    main = {
        "256x32": _cell("256x32", 17_000.0, 300.0, 600.0),
        "256x32 base64": _cell("256x32", 19_000.0, 300.0, 600.0),
    }
    assert "  [PASS] 256x32 float >= 0.85 x base64: 0.89 (17,000 / 19,000)" in targets(
        main, 256, ceiling=40_000.0
    )


def test_a_cell_on_fewer_workers_than_asked_fails_and_says_so() -> None:
    c = _cell("256x32", 25_000.0, 300.0, 900.0)
    assert not c.failed
    c.workers_ready = 3.0
    assert c.failed and "zhembed_workers_ready 3" in format_cell(c)


@pytest.mark.slow  # the whole device script on the CPU: the probe, the answer path and 5 cells, ~60 s
def test_the_device_script_runs_end_to_end_on_the_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "MODEL": str(tiny_model_dir)}
    argv = ["bash", "loadtest/gpu_check.sh", "--provider", "CPUExecutionProvider", "--budget", "600"]
    argv += ["--shape-grid", "on"]  # the grid a GPU gets by default, warmed before /ready
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert set(report["stages"]) == {"export", "first_run", "answer_path"}
    assert report["first_run"]["runs"][0]["config"] == "defaults"
    assert [(c["rows"], c["per_request"]) for c in report["answer_path"]["cells"]] == [(256, 32), (1, 1)]
    assert [(c["label"], c["workers"]) for c in report["cells"]][-1] == ("8x32", 2)
    grid = report["shape_grid"]["1"]  # /info's, once the service was ready
    assert 0 < grid["warmed_shapes"] <= grid["shapes"] and grid["io_binding"] is True
    assert re.search(r"ready in [\d.]+ s; \d+ of \d+ grid shapes warmed in [\d.]+ s", done.stdout)
    page = (tmp_path / "gpu-check.md").read_text()
    assert "First-run probe" in page and "Answer path of /embed" in page and "| gpu_check |" in page
    assert re.search(
        r"^gpu_check.sh: \d+ s, within the budget of 600 s \(export: \d+, first_run: \d+",
        done.stdout,
        re.MULTILINE,
    )


def test_a_worker_count_that_would_end_past_the_budget_is_left_out() -> None:
    assert over_budget(elapsed=400.0, last=90.0, budget=480.0)
    assert not over_budget(elapsed=380.0, last=90.0, budget=480.0)
    assert not over_budget(elapsed=4000.0, last=90.0, budget=0.0)  # no budget
