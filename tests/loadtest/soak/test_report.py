"""loadtest.soak.report: the memory of every process of the server, and the verdict drawn from it."""

from __future__ import annotations

import pytest

from loadtest import procs
from loadtest.soak.faults import PidSlots
from loadtest.soak.report import GROWTH_TARGET, Seen, SoakReport, growth_by_process, render

MB = procs.MB


def _tree(*rows: tuple[int, str, float], cpu: dict[int, float] | None = None) -> procs.Tree:
    """A reading of (pid, role, PSS in MB) rows; RSS is PSS + 10 MB of shared pages; CPU seconds by pid."""
    return procs.Tree(
        tuple(
            procs.ProcessReading(
                pid, role, procs.Memory(int((mb + 10) * MB), int(mb * MB)), (cpu or {}).get(pid, 0.0)
            )
            for pid, role, mb in rows
        )
    )


def _report(
    start: procs.Tree,
    end: procs.Tree,
    baseline: procs.Tree | None = None,
    seen: dict[int, tuple[Seen, Seen]] | None = None,
    slots: PidSlots | None = None,
) -> SoakReport:
    """A one-minute soak's report; the baseline at 30 s if given, else the start."""
    memory = growth_by_process(start, baseline or start, end, 60.0, seen, slots)
    return SoakReport(
        "m", None, 1.0, 1.0, 1, 0.0 if baseline is None else 30.0, memory, 10, 0, None, {200: 10}
    )


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


def test_growth_is_measured_from_the_baseline_and_from_the_start() -> None:
    start = _tree((1, "supervisor", 60.0), (2, "worker", 200.0))
    warm = _tree((1, "supervisor", 60.0), (2, "worker", 300.0))  # the warm-up's growth, before the baseline
    end = _tree((1, "supervisor", 60.0), (2, "worker", 303.0))
    report = _report(start, end, baseline=warm)
    (worker,) = report.workers
    assert worker.growth == pytest.approx(0.01) and worker.growth_start == pytest.approx(0.515)
    assert worker.pss_base_mb == pytest.approx(300.0)
    assert report.ok and render(report).endswith("PASS")
    assert not _report(start, end).ok  # from the start it grew 51%


def test_a_replaced_worker_is_a_new_pid_in_the_same_slot_and_fails() -> None:
    start = _tree((1, "supervisor", 60.0), (2, "worker", 300.0), (3, "worker", 300.0))
    end = _tree((1, "supervisor", 60.0), (2, "worker", 300.0), (4, "worker", 290.0))
    slots = PidSlots([2, 3])
    slots.update([2, 4], 20.0)
    seen = {3: ((0.0, start.processes[2]), (19.0, start.processes[2])), 4: ((20.0, end.processes[2]),) * 2}
    report = _report(start, end, seen=seen, slots=slots)
    rows = [(g.role, g.pid, g.slot, g.first_s, g.last_s) for g in report.memory]
    assert rows == [
        ("supervisor", 1, None, None, None),
        ("worker", 2, 0, None, None),
        ("worker", 3, 1, None, 19.0),
        ("worker", 4, 1, 20.0, None),
        ("tree", None, None, None, None),
    ]
    assert report.memory[2].pss_end_mb == 300.0 and report.memory[2].growth is None  # its last reading
    assert report.memory[3].growth is None and report.memory[3].growth_start == 0.0  # new: from its first
    assert report.tree.rss_start_mb == pytest.approx(70.0 + 2 * 310.0)
    assert not report.memory_ok and not report.ok
    text = render(report)
    assert "gone at 19.0 s" in text and "new at 20.0 s" in text and text.endswith("FAIL")


def test_each_process_shows_the_cpu_it_used_during_the_soak() -> None:
    rows = ((1, "supervisor", 60.0), (2, "worker", 300.0), (3, "worker", 300.0))
    start = _tree(*rows, cpu={1: 1.0, 2: 10.0, 3: 10.0})
    end = _tree(*rows, cpu={1: 1.5, 2: 70.0, 3: 12.0})
    report = _report(start, end)
    assert [g.cpu_s for g in report.memory] == [0.5, 60.0, 2.0, 62.5]
    workers = [line for line in render(report).splitlines() if line.startswith("worker ")]
    assert [line.split()[-1] for line in workers] == ["60.0", "2.0"]
