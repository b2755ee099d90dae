"""``loadtest/gpu_check.py`` has no GPU here; its CPU mode runs the same steps so the script cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts the service on the tiny model's fp16 graph: ~20 s on 2 cores
def test_gpu_check_runs_end_to_end_on_the_cpu_provider(tiny_model_dir: Path) -> None:
    # 8 clients and 1.5 s cells: with 128 clients a request outlasted the 0.6 s window on 2 busy cores, so
    # the cell counted nothing or a phase artefact (a rate above the raw ceiling).
    cpu = ["--provider", "CPUExecutionProvider", "--seconds", "0.5", "--clients", "8"]
    args = ["--model", str(tiny_model_dir), *cpu]
    run = subprocess.run(
        [sys.executable, "-m", "loadtest.gpu_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    cosine = float(out.split("pooled cosine min:")[1].split()[0])
    assert cosine > 0.99
    raw_rows = [x.split() for x in out.splitlines() if x.strip() and x.split()[0] in ("32", "128")]
    for seq in (32, 128):
        line = next(x for x in out.splitlines() if x.startswith(f"service seq≈{seq}:"))
        assert line.endswith("errors 0"), line
        rate = float(line.split(": ")[1].split()[0])
        best_raw = max(float(row[2]) for row in raw_rows if row[0] == str(seq))
        # Above the raw ceiling would mean the service computed fewer texts than it was sent (a repeated
        # text is computed once), so the cell measured nothing.
        assert 0 < rate < best_raw, (line, best_raw)
