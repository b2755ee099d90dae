"""loadtest.soak: the memory of every process of the server, the verdict drawn from it, and a soak with
faults in it (loadtest.faults: the schedule, the slots, every request's fate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import faults, procs
from loadtest.faults import FaultEvent, FaultSpecError, Request, Slots, fate_of, fate_table, parse_faults
from loadtest.soak import GROWTH_TARGET, Seen, SoakReport, growth_by_process, render
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


def _report(
    start: procs.Tree,
    end: procs.Tree,
    baseline: procs.Tree | None = None,
    seen: dict[int, tuple[Seen, Seen]] | None = None,
    slots: Slots | None = None,
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
    slots = Slots([2, 3])
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


# --- the faults -------------------------------------------------------------------------------------


def test_the_fault_schedule_in_seconds_minutes_or_a_share_with_the_sigterm_last() -> None:
    parsed = parse_faults("redis@20m, kill@90s,bound", 3600.0, bound=True)
    assert [(f.kind, f.at_s) for f in parsed] == [
        ("kill", 90.0),
        ("redis", 1200.0),
        ("bound", None),
        ("term", None),
    ]
    assert [(f.kind, f.at_s) for f in parse_faults("default", 400.0, bound=False)] == [
        ("kill", 100.0),
        ("redis", 200.0),
        ("term", None),
    ]
    assert [f.kind for f in parse_faults("default", 400.0, bound=True)] == ["kill", "redis", "bound", "term"]
    assert parse_faults("", 60.0, bound=False) == parse_faults("none", 60.0, bound=False) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kill@2h", "NUMBER then s, m or %"),
        ("kill@70s", "outside the soak"),
        ("kill@100%", "outside the soak"),
        ("crash@1m", "unknown fault"),
        ("bound", "needs --worker-max-memory-mb"),
        ("term@30s", "takes no time"),
    ],
)
def test_a_fault_schedule_that_cannot_run_is_refused(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec, 60.0, bound=False)


def test_slots_follow_a_killed_worker_and_a_replacement_that_starts_first() -> None:
    slots = Slots([20, 10])
    assert (slots.slot(10), slots.slot(20)) == (0, 1)
    # kill -9: the old one gone and its replacement there in the same reading
    assert slots.update([20, 30], 5.0) == [("gone", 10, 0, 5.0), ("new", 30, 0, 5.0)]
    # the memory bound: the replacement first, while every slot is full; the old one stops later
    assert slots.update([20, 30, 40], 8.0) == [("waiting", 40, None, 8.0)]
    assert slots.slot(40) is None and slots.holder(1) == 20
    assert slots.update([30, 40], 11.0) == [("gone", 20, 1, 11.0), ("new", 40, 1, 8.0)]
    assert slots.holder(1) == 40 and slots.update([30, 40], 12.0) == []


def test_a_request_fate_from_its_answer_or_its_error() -> None:
    assert fate_of(200, None, True, False) == "200"
    assert fate_of(200, None, True, True) == "200 + retried"
    assert fate_of(503, None, True, False) == "HTTP 503"
    assert fate_of(None, ConnectionResetError(), False, False) == "lost: no answer"
    assert fate_of(None, EOFError(), True, True) == "lost: answer cut + retried"
    assert fate_of(None, ConnectionRefusedError(), False, False) == "refused: no connection"
    assert fate_of(None, TimeoutError(), False, False) == "error: TimeoutError"


def test_the_fate_table_allows_losses_only_on_the_killed_worker_and_503_only_at_the_sigterm() -> None:
    events = [
        FaultEvent(faults.KILL, 10.0, 12.0, "kill", on_killed=[1, 2]),
        FaultEvent(faults.REDIS, 20.0, 25.0, "redis"),
        FaultEvent(faults.TERM, 40.0, 42.0, "term"),
    ]
    requests = [
        Request(0, 1.0, 1.1, "200"),
        Request(1, 9.9, 10.0, "lost: no answer"),  # in flight on the killed worker
        Request(2, 9.8, 10.5, "200 + retried"),
        Request(3, 10.2, 10.3, "200"),  # in the kill's window
        Request(4, 13.5, 13.6, "200"),  # within the settle time after it
        Request(5, 15.0, 15.1, "200"),  # after it
        Request(6, 19.0, 20.5, "lost: no answer"),  # in flight when Redis stopped: a loss
        Request(7, 39.9, 40.2, "HTTP 503"),  # in flight at the SIGTERM, refused by the drain
        Request(8, 39.8, 40.1, "200"),
    ]
    table = fate_table(requests, events, settle_s=2.0)
    assert table == {
        faults.NONE: {"200": 2},
        faults.ON_KILLED: {"200 + retried": 1, "lost: no answer": 1},
        faults.KILL: {"200": 2},
        faults.REDIS: {"lost: no answer": 1},
        faults.IN_FLIGHT_AT_TERM: {"200": 1, "HTTP 503": 1},
    }
    assert faults.losses(table) == {faults.REDIS: 1}
    text = faults.render_table(table)
    assert text.splitlines()[0].split()[:3] == ["fault", "200", "200"]  # the answered fates first
    assert len(text.splitlines()) == 1 + len(table)


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
