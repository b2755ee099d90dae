"""loadtest.soak: the memory of every process of the server, and the verdict drawn from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import procs
from loadtest.soak import GROWTH_TARGET, SoakReport, growth_by_process, render
from tests.loadtest.conftest import run_module

MB = procs.MB


def _tree(*rows: tuple[int, str, float], cpu: dict[int, float] | None = None) -> procs.Tree:
    """A reading of (pid, role, PSS in MB) rows; RSS is PSS + 10 MB of shared pages; CPU seconds by pid."""
    return procs.Tree(
        tuple(
            procs.Process(
                pid, role, procs.Memory(int((mb + 10) * MB), int(mb * MB)), (cpu or {}).get(pid, 0.0)
            )
            for pid, role, mb in rows
        )
    )


def _report(start: procs.Tree, end: procs.Tree) -> SoakReport:
    return SoakReport("m", None, 1.0, 1.0, 1, growth_by_process(start, end), 10, 0, None, {200: 10})


def test_one_growing_worker_fails_the_soak_though_the_tree_stays_under_the_target() -> None:
    workers = [(10 + i, "worker", 400.0) for i in range(8)]
    start = _tree((1, "supervisor", 60.0), *workers)
    end = _tree((1, "supervisor", 60.0), *workers[:7], (17, "worker", 400.0 * (1 + 2 * GROWTH_TARGET)))
    report = _report(start, end)
    assert report.tree.growth is not None and report.tree.growth < GROWTH_TARGET
    assert [round(w.growth or 0, 3) for w in report.workers] == [0.0] * 7 + [2 * GROWTH_TARGET]
    assert not report.ok
    assert render(report).endswith("FAIL")
    assert _report(start, start).ok


def test_a_replaced_worker_shows_gone_and_new_and_fails() -> None:
    start = _tree((1, "supervisor", 60.0), (2, "worker", 300.0), (3, "worker", 300.0))
    end = _tree((1, "supervisor", 60.0), (2, "worker", 300.0), (4, "worker", 300.0))
    report = _report(start, end)
    assert [(g.role, g.pid) for g in report.memory] == [
        ("supervisor", 1),
        ("worker", 2),
        ("worker", 3),
        ("worker", 4),
        ("tree", None),
    ]
    assert report.tree.growth == 0.0 and not report.ok
    text = render(report)
    assert "gone" in text and "new" in text and text.endswith("FAIL")
    assert report.tree.rss_start_mb == pytest.approx(70.0 + 2 * 310.0)
    assert report.memory[2].pss_end_mb is None and report.memory[3].pss_start_mb is None


@pytest.mark.slow  # exports a tiny model and starts a supervisor with two workers: ~40 s on 2 cores
def test_quick_soak_with_two_workers_reports_each_worker(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ("--quick", "--minutes", "0.1", "--rate", "10", "--window-s", "3", "--json", str(out))
    stdout = run_module(
        "loadtest.soak", *args, "--log", str(tmp_path / "server.log"), env={"ZHEMBED_WORKERS": "2"}
    )
    report = json.loads(out.read_text())
    roles = [g["role"] for g in report["memory"]]
    assert roles[0] == "supervisor" and roles[-1] == "tree" and roles.count("worker") == 2
    *rows, tree = report["memory"]
    for key in ("pss_start_mb", "pss_end_mb", "rss_start_mb", "rss_end_mb"):
        assert tree[key] == pytest.approx(sum(g[key] for g in rows))  # the rows add up to the tree
    workers = [g for g in rows if g["role"] == "worker"]
    assert all(w["pss_start_mb"] > 20 and w["growth"] is not None and w["cpu_s"] >= 0 for w in workers)
    assert tree["cpu_s"] > 0  # the workers' work, read from each
    assert report["errors"] == 0 and report["requests"] > 0
    assert all(len(w["workers_mb"]) == 2 for w in report["windows"])
    assert sum(line.startswith("worker ") for line in stdout.splitlines()) == 2


def test_each_process_shows_the_cpu_it_used_during_the_soak() -> None:
    rows = ((1, "supervisor", 60.0), (2, "worker", 300.0), (3, "worker", 300.0))
    start = _tree(*rows, cpu={1: 1.0, 2: 10.0, 3: 10.0})
    end = _tree(*rows, cpu={1: 1.5, 2: 70.0, 3: 12.0})
    report = _report(start, end)
    assert [g.cpu_s for g in report.memory] == [0.5, 60.0, 2.0, 62.5]
    workers = [line for line in render(report).splitlines() if line.startswith("worker ")]
    assert [line.split()[-1] for line in workers] == ["60.0", "2.0"]
