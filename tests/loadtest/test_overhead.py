"""``python -m loadtest.overhead --quick`` runs end to end on the tiny model, and its numbers hang together;
``--in-process`` runs the service and engine in-process, no HTTP; ``--protocols`` the same load over each
protocol, each cell measured.
No timing thresholds: the targets live in the benchmark's PASS/MISS lines, not here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.settings import Settings
from loadtest.harness.cell import parse_cells
from loadtest.harness.report import Row
from loadtest.overhead import floor, targets
from tests.loadtest.conftest import run_module


@pytest.mark.slow  # exports a 4-layer tiny model and starts the service: ~35 s on 2 cores
def test_quick_overhead_measures_each_cell_and_splits_the_server_cpu(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    stdout = run_module("loadtest.overhead", "--quick", "--out", str(out))
    report = json.loads(out.read_text())
    assert [c["label"] for c in report["cells"]] == ["8x32", "32x1"]
    max_batch = Settings.model_fields["max_batch_size"].default
    for c in report["cells"]:
        assert c["errors"] == 0 and c["requests"] > 0, c
        assert c["status_counts"] == {"200": c["requests"]}, c
        # The service computed at least what the client saw answered inside the measured window.
        assert c["computed"] >= c["requests"] * c["texts"], c
        assert 1 <= c["mean_batch"] <= max_batch, c
        assert 0 < c["session_run_s"] <= c["server_cpu_s"], c
        assert c["outside_us_per_sentence"] >= 0, c
        assert c["cpu_us_per_sentence"] == pytest.approx(
            c["session_run_us_per_sentence"] + c["outside_us_per_sentence"]
        )
    for c in report["cells"]:
        # The floor was measured on this cell's texts, and the machinery is what is left of outside.
        assert c["tokenize_us"] > 0 and c["write_us"] > 0, c
        assert c["floor_us_per_sentence"] == pytest.approx(c["tokenize_us"] + c["write_us"])
        assert c["machinery_us_per_sentence"] == pytest.approx(
            c["outside_us_per_sentence"] - c["floor_us_per_sentence"]
        )
    assert report["gpu_like"] is False
    assert len(report["raw"]["sentences_per_s"]) == 2 and min(report["raw"]["sentences_per_s"]) > 0
    assert re.search(
        r"\[(PASS|MISS)\] machinery <= 60 us/sentence at 8x32 \(CPU defaults\): -?\d+ us", stdout
    )
    assert "[n/a ] machinery <= 25 us/sentence at 64x32 (--gpu-like): run with --gpu-like" in stdout
    assert re.search(r"\[(PASS|MISS)\] CPU outside Session.run <= 250 us/request at 32x1: \d+ us", stdout)
    assert "[n/a ] 256x32 sentences/s >= 0.9 x 8x32" in stdout


def test_the_floor_is_tokenising_and_writing_in_a_process_of_its_own(tmp_path: Path) -> None:
    from loadtest.quick_model import export_tiny

    model = export_tiny(tmp_path / "source", tmp_path / "model", ("fp32",), 2)
    tokenize_us, write_us = floor(model, texts_per_request=32, start=0, count=256)
    assert 0 < tokenize_us < 10_000 and 0 < write_us < 10_000


def test_gpu_like_targets_are_the_machinery_at_64_and_256_clients() -> None:
    def made(label: str, outside: float, floor_us: float) -> Row:
        c = parse_cells(label)[0]
        # 1e4 sentences computed, 100 us of Session.run each, `outside` us of the rest.
        return Row(label, clients=c.clients, texts=c.texts, sentences_per_s=1000.0, computed=1e4,
                   server_cpu_s=1e-2 * (100 + outside), session_run_s=1.0, tokenize_us=floor_us, write_us=0.0)  # fmt: skip

    lines = targets([made("64x32", 30.0, 10.0), made("256x32", 50.0, 10.0)], gpu_like=True)
    assert "  [PASS] machinery <= 25 us/sentence at 64x32 (--gpu-like): 20 us" in lines, lines
    assert "  [MISS] machinery <= 25 us/sentence at 256x32 (--gpu-like): 40 us" in lines, lines
    assert any(
        line.startswith("  [n/a ] machinery <= 60 us/sentence at 8x32 (CPU defaults)") for line in lines
    )


@pytest.mark.slow  # exports a 4-layer tiny model: ~15 s on 2 cores
def test_in_process_each_cell_splits_the_cpu_into_the_model_and_the_rest(tmp_path: Path) -> None:
    model, cells = str(tmp_path / "model"), "4x8,8x1"
    args = ("--in-process", "--model", model, "--cells", cells, "--duration", "1", "--warmup", "0.25")
    stdout = run_module("loadtest.overhead", *args)
    for label in ("4x8", "8x1"):
        row = re.search(rf"^{label}\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(.*)$", stdout, re.M)
        assert row is not None, stdout
        rate, batch, total, in_run, outside = (float(row[k]) for k in range(1, 6))
        assert rate > 0 and batch >= 1 and in_run > 0
        assert total == pytest.approx(in_run + outside, abs=1.5)  # each rounded on its own
        assert "zhembed-inference:" in row[6]  # the inference thread's CPU, by name


def test_protocols_are_measured_side_by_side() -> None:
    stdout = run_module("loadtest.overhead", "--protocols", "http,grpc,tei", "--quick")
    for protocol in ("http", "grpc", "grpc tei"):
        row = re.search(rf"^{re.escape(protocol)}\s+(\d+)\s+([\d.]+)\s+(\d+)\s+[\d.]+\s+0$", stdout, re.M)
        assert row is not None, stdout
        assert int(row[1]) > 0 and int(row[3]) > 0
    assert re.search(r"^grpc / http: sentences/s [\d.]+x, server CPU per sentence [\d.]+x$", stdout, re.M)
