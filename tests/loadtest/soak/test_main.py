"""``python -m loadtest.soak --quick`` with faults in it runs end to end: a supervisor with two workers,
a Redis, a kill, and every request's fate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.soak import faults
from tests.loadtest.conftest import run_module


@pytest.mark.slow  # exports a tiny model, starts a supervisor with two workers and a Redis: ~60 s on 2 cores
def test_quick_soak_with_faults_loses_nothing_but_the_killed_workers_and_reports_each_worker(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    args = ("--quick", "--minutes", "0.25", "--rate", "20", "--window-s", "3", "--json", str(out))
    # Redis first, over before the kill; the kill no sooner than 10 s after the workers' start (the
    # supervisor stops the service on an earlier death).
    fault_args = ("--faults", "redis@2s,kill@9s", "--redis-down-s", "2", "--settle-s", "1")
    stdout = run_module(
        "loadtest.soak",
        *args,
        *fault_args,
        "--log",
        str(tmp_path / "server.log"),
        env={"ZHEMBED_WORKERS": "2"},
    )
    report = json.loads(out.read_text())
    *rows, tree = report["memory"]
    assert rows[0]["role"] == "supervisor" and tree["role"] == "tree"
    workers = [g for g in rows if g["role"] == "worker"]
    # the killed worker (gone, slot 0), the other one, and the killed one's replacement (new, slot 0)
    assert sorted((w["slot"], w["first_s"] is not None, w["last_s"] is not None) for w in workers) == [
        (0, False, True),
        (0, True, False),
        (1, False, False),
    ]
    at_end = [g for g in rows if g["last_s"] is None]
    for key in ("pss_end_mb", "rss_end_mb"):
        assert tree[key] == pytest.approx(sum(g[key] for g in at_end))  # the rows there at the end add up
    assert all(w["pss_start_mb"] > 20 and w["cpu_s"] >= 0 for w in workers if w["first_s"] is None)
    assert [e["kind"] for e in report["faults"]] == ["redis", "kill", "term"]
    assert all(e["end_s"] is not None for e in report["faults"])  # replaced, Redis back, exited
    fates = report["fates"]
    assert fates["none"]["200"] > 0 and fates["redis"]["200"] > 0  # answered from the model meanwhile
    on_killed = report["faults"][1]["on_killed"]
    assert sum(fates.get(faults.ON_KILLED, {}).values()) == len(on_killed)
    assert faults.losses(fates) == {}  # lost: only what was in flight on the killed worker
    assert report["exit_code"] == 0
    assert stdout.splitlines()[-1] == "PASS"
    assert sum(line.startswith("worker ") for line in stdout.splitlines()) == 3
