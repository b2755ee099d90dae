"""The single-machine job continues where it stopped: killed with SIGKILL mid-run and run again, the
folder equals an uninterrupted run's, every id once; a shard holds the same input rows whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from app.bulk.runner import BulkSpec, pieces
from app.bulk.sources import Fields, find_inputs
from tests.app.bulk.conftest import errors, manifest, run_bulk, shards, vectors, write_jsonl

ROOT = Path(__file__).resolve().parents[3]


def test_shards_hold_fixed_input_ranges_across_files_and_skip_finished_ones(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": str(i)} for i in range(7)])
    write_jsonl(tmp_path / "in" / "b.jsonl", [{"text": str(i)} for i in range(5)])
    files = find_inputs(str(tmp_path / "in"), None, Fields())
    job = BulkSpec(files, Fields(), tmp_path / "out", 5, "float", "in", None)
    got = [(shard, rows.ids) for shard, rows in pieces(job, skip=set())]
    assert got == [
        (0, [f"a.jsonl:{n}" for n in range(1, 6)]),
        (1, ["a.jsonl:6", "a.jsonl:7"]),
        (1, [f"b.jsonl:{n}" for n in range(1, 4)]),
        (2, ["b.jsonl:4", "b.jsonl:5"]),
    ]
    assert [shard for shard, _ in pieces(job, skip={0, 2})] == [1, 1]


def test_killed_mid_run_then_run_again_equals_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = [{"text": f"{n} 号：今天天气很好，我们去公园散步吧。" * (1 + n % 3)} for n in range(6000)]
    for n in range(0, 6000, 997):
        rows[n] = {"text": ""}  # bad rows on both sides of the kill
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    flags = ["--shard-rows", "300", "--window", "256"]
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "app.bulk", "--model", str(tiny_model_dir), "--variant", "fp32"]
    command += [
        "--intra-op-threads",
        "1",
        "--input",
        str(corpus),
        "--output",
        str(killed),
        "--progress",
        "off",
        *flags,
    ]
    job = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while len(list(killed.glob("part-*.parquet"))) < 3:
        assert job.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.wait()
    finished_then = len(list(killed.glob("part-*.parquet")))
    assert 3 <= finished_then < 20 and manifest(killed)["status"] == "running"
    assert run_bulk(tiny_model_dir, corpus, killed, *flags) == 3
    assert manifest(killed)["runs"] == 2

    whole = tmp_path / "whole"
    assert run_bulk(tiny_model_dir, corpus, whole, *flags) == 3
    a, b = vectors(killed), vectors(whole)
    assert list(a) == list(b) and len(a) == 6000 - 7  # every id once, in input order
    assert np.abs(np.stack(list(a.values())) - np.stack(list(b.values()))).max() <= 1e-5
    assert shards(killed).column("tokens").equals(shards(whole).column("tokens"))
    assert (
        errors(killed)
        == errors(whole)
        == [{"id": f"c.jsonl:{n + 1}", "error": "text is empty"} for n in range(0, 6000, 997)]
    )
    assert manifest(killed)["counts"] == manifest(whole)["counts"]
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in whole.iterdir())
