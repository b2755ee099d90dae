"""What a soak found: the latency and memory of each window, each process's memory over the soak, the
requests' fates, and the verdict, as one report and its printed form."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadtest import procs
from loadtest.harness.report import cell
from loadtest.soak import faults
from loadtest.soak.faults import FaultEvent, PidSlots, Table

GROWTH_TARGET = 0.05
REPLACEMENTS = "zhembed_worker_replacements_total"


@dataclass
class Window:
    start_s: float  # seconds into the soak
    requests: int
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    tree_mb: float  # PSS of the whole process tree, at the window's last reading
    workers_mb: list[float]  # PSS of each worker then, by slot (a replacement not yet in one, last)
    late_starts: int  # requests sent over 100 ms after their slot: the client pool was exhausted


@dataclass
class Growth:
    """One process of the tree (or the tree, ``pid`` None) over the soak: from its reading at the start (its
    first if it started later, ``first_s``) and at the baseline to its reading at the end (its last if it
    ended, ``last_s``)."""

    role: str
    pid: int | None
    slot: int | None  # workers only
    first_s: float | None  # when it was first seen, if after the start
    last_s: float | None  # when it was last seen, if before the end
    rss_start_mb: float
    rss_end_mb: float
    pss_start_mb: float
    pss_base_mb: float | None  # None: not there at the baseline
    pss_end_mb: float
    growth: float | None  # of PSS from the baseline to the end (the target): None unless there at both
    growth_start: float | None  # of PSS from its start (or first reading) to the end: None if it ended
    cpu_s: float  # CPU seconds used from its start (or first reading) to its end (or last reading)


Seen = tuple[float, procs.ProcessReading]  # seconds into the soak, the reading
Reading = tuple[float, procs.ProcessReading | procs.Tree]  # a process's or the tree's


def _growth(
    first: Reading,
    base: procs.ProcessReading | procs.Tree | None,
    last: Reading,
    seconds: float,
    slot: int | None,
) -> Growth:
    """A process's (or the tree's) row from its first reading, the baseline's and its last."""
    (t0, a), (t1, b) = first, last
    ended = t1 < seconds
    role, pid = ("tree", None) if isinstance(a, procs.Tree) else (a.role, a.pid)
    return Growth(
        role,
        pid,
        slot,
        t0 if t0 > 0 else None,
        t1 if ended else None,
        a.memory.rss / procs.MB,
        b.memory.rss / procs.MB,
        a.memory.pss / procs.MB,
        None if base is None else base.memory.pss / procs.MB,
        b.memory.pss / procs.MB,
        None if base is None or ended else (b.memory.pss - base.memory.pss) / base.memory.pss,
        None if ended else (b.memory.pss - a.memory.pss) / a.memory.pss,
        b.cpu_s - a.cpu_s,
    )


def growth_by_process(
    start: procs.Tree,
    baseline: procs.Tree,
    end: procs.Tree,
    seconds: float,
    seen: dict[int, tuple[Seen, Seen]] | None = None,
    slots: PidSlots | None = None,
) -> list[Growth]:
    """Each process of any reading, in the order first seen, then the tree: from the tree at the start (0 s),
    the baseline and the end (``seconds``), and ``seen``, each pid's first and last reading in between."""
    seen = dict(seen or {})
    for p in start.processes:
        seen[p.pid] = ((0.0, p), seen.get(p.pid, ((0.0, p), (0.0, p)))[1])
    for p in end.processes:
        seen[p.pid] = (seen.get(p.pid, ((seconds, p), (seconds, p)))[0], (seconds, p))
    base = {p.pid: p for p in baseline.processes}
    rows = []
    for pid, (first, last) in sorted(seen.items(), key=lambda kv: (kv[1][0][0], kv[0])):
        rows.append(_growth(first, base.get(pid), last, seconds, None if slots is None else slots.slot(pid)))
    return [*rows, _growth((0.0, start), baseline, (seconds, end), seconds, None)]


@dataclass
class SoakReport:
    model: str
    capacity_rps: float | None
    rate_rps: float
    minutes: float
    texts_per_request: int
    baseline_s: float  # seconds into the soak of the baseline reading (0: the start)
    memory: list[Growth]  # each process, then the tree (the last row)
    requests: int  # answered 200
    errors: int  # every other fate
    first_error: str | None
    status_counts: dict[int, int]
    windows: list[Window] = field(default_factory=list)
    retried: int = 0  # sent again on a new connection (not errors: :class:`loadtest.loadgen._Connection`)
    reopened: int = 0  # idle connections found closed by the server, reopened before a request
    faults: list[FaultEvent] = field(default_factory=list)
    fates: Table = field(default_factory=dict)
    exit_code: int | None = None  # the service's, after the SIGTERM (faults) or when it died
    replacements: float | None = None  # zhembed_worker_replacements_total at the end, where exported
    notes: list[str] = field(default_factory=list)

    @property
    def tree(self) -> Growth:
        return self.memory[-1]

    @property
    def workers(self) -> list[Growth]:
        return [g for g in self.memory if g.role == "worker"]

    @property
    def lost(self) -> dict[str, int]:
        """Per fault, the requests with a fate it does not allow (:func:`loadtest.soak.faults.losses`)."""
        return faults.losses(self.fates)

    @property
    def memory_ok(self) -> bool:
        """The tree and each worker there from start to end (one that ended has no growth), under target."""
        rows = (self.tree, *self.workers)
        return all(g.first_s is None and g.growth is not None and g.growth < GROWTH_TARGET for g in rows)

    @property
    def requests_ok(self) -> bool:
        return not self.lost and self.exit_code in (None, 0)

    @property
    def ok(self) -> bool:
        """With faults, the requests' fates and the exit; without, those and the memory."""
        return self.requests_ok and (bool(self.faults) or self.memory_ok)


def _pct(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:+.1%}':>{width}}"


def render(report: SoakReport) -> str:
    lines = [
        f"{'from s':>6} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'tree MB':>8} {'late':>5}  workers MB"
    ]
    for m in report.windows:
        lines.append(
            f"{m.start_s:>6.0f} {m.requests:>9} {m.errors:>7} {m.p50_ms:>8.1f} {m.p90_ms:>8.1f} {m.p99_ms:>8.1f} "
            f"{m.max_ms:>8.1f} {m.tree_mb:>8.1f} {m.late_starts:>5}  "
            + " ".join(f"{w:.1f}" for w in m.workers_mb)
        )
    base = "the start" if report.baseline_s == 0 else f"{report.baseline_s / 60:g} min"
    lines += [
        "memory in MB; PSS splits each shared page among the processes that map it, so the rows add up to "
        f"the tree; RSS (as top shows it) counts shared pages in every process; base: PSS at {base}; growth: "
        "of PSS from base to the end (the target), and from the start; CPU s: used during the soak; a pid "
        "new during the soak starts at its first reading, one gone ends at its last",
        f"{'process':<18}{'slot':>5}{'pid':>8}{'RSS start':>11}{'RSS end':>9}{'PSS start':>11}{'PSS base':>10}"
        f"{'PSS end':>9}{'growth':>9}{'g. start':>10}{'CPU s':>8}  note",
    ]
    for g in report.memory:
        notes = [f"new at {g.first_s:.1f} s"] if g.first_s is not None else []
        notes += [f"gone at {g.last_s:.1f} s"] if g.last_s is not None else []
        lines.append(
            f"{g.role:<18}{'' if g.slot is None else g.slot:>5}{'' if g.pid is None else g.pid:>8}"
            f"{cell(g.rss_start_mb, '.1f', 11)}{cell(g.rss_end_mb, '.1f', 9)}"
            f"{cell(g.pss_start_mb, '.1f', 11)}{cell(g.pss_base_mb, '.1f', 10)}{cell(g.pss_end_mb, '.1f', 9)}"
            f"{_pct(g.growth, 9)}{_pct(g.growth_start, 10)}{cell(g.cpu_s, '.1f', 8)}  {' '.join(notes)}"
        )
    if report.faults:
        lines.append("faults (s into the soak):")
        for e in report.faults:
            lines.append(f"  {e.kind:<12} {e.start_s:>8.1f} → {cell(e.end_s, '.1f', 8)}  {e.detail}")
    if report.fates:
        lines += ["every request's fate by the fault it met:", faults.render_table(report.fates)]
    lines += [f"note: {n}" for n in report.notes]
    worst = max((w.growth for w in report.workers if w.growth is not None), default=None)
    memory = "PASS" if report.memory_ok else "FAIL"
    lines.append(
        f"memory: tree PSS {report.tree.pss_start_mb:.1f} MB at the start, "
        + ("" if report.baseline_s == 0 else f"{report.tree.pss_base_mb:.1f} MB at {base}, ")
        + f"{report.tree.pss_end_mb:.1f} MB at the end ({_pct(report.tree.growth, 0).strip()} from {base}), "
        f"{len(report.workers)} worker pids"
        + ("" if worst is None else f" (most growth {worst:+.1%})")
        + f"; target < {GROWTH_TARGET:.0%} each, no worker gone or new: {memory}"
        + (" (not judged with faults)" if report.faults else "")
    )
    on_killed = report.fates.get(faults.ON_KILLED, {})
    lost = report.lost
    lines.append(
        f"requests: {report.requests} answered 200, {report.errors} not; {report.retried} sent again on a new "
        f"connection (counted, not errors), {report.reopened} idle connections found closed; statuses "
        f"{report.status_counts}"
        + (f"; {sum(on_killed.values())} in flight on the killed worker ({on_killed})" if on_killed else "")
        + ("" if report.exit_code is None else f"; the service exited {report.exit_code}")
        + ("" if report.replacements is None else f"; {REPLACEMENTS} {report.replacements:g}")
        + f"; lost where no loss is allowed: {lost or 0} (target 0): {'PASS' if report.requests_ok else 'FAIL'}"
    )
    if report.first_error:
        lines.append(f"first error: {report.first_error}")
    lines.append("PASS" if report.ok else "FAIL")
    return "\n".join(lines)
