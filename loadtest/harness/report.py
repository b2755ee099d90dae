"""One row type for every benchmark, its table's columns, its targets as PASS / MISS lines, and the JSON
report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from loadtest.harness.measure import INFERENCE_SUM, WORKERS_READY, Measured
from loadtest.loadgen import CellResult

RESULTS = Path(__file__).parents[1] / "results"
NAN = float("nan")
# A closed-loop cell counts the requests that end in its window. When a request takes a good part of the
# window, which ones end inside it depends on phase (length-grouped batches finish many requests at once),
# so the rate is noise; such rows say so rather than report it as a measurement.
MIN_WINDOW_PER_P50 = 3.0


def reliability_warning(r: CellResult) -> str | None:
    """Why the cell's rate is not a measurement, or None when it is."""
    if not r.latencies_ms and not r.errors:
        return "UNRELIABLE rate: no request ended in the window (longer --duration)"
    if r.latencies_ms and r.percentile(50) * MIN_WINDOW_PER_P50 > r.wall_s * 1000:
        return f"UNRELIABLE rate: window {r.wall_s:.0f} s < {MIN_WINDOW_PER_P50:.0f}x p50 (longer --duration)"
    return None


def cpu_model() -> str:
    """This machine's CPU, as /proc/cpuinfo names it: every run's header says where it ran."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "unknown CPU")


def mark(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "MISS")


def joined(*parts: str) -> str:
    """The parts that are not empty, joined by ``; ``."""
    return "; ".join(x for x in parts if x)


def target(name: str, ok: bool | None, detail: str) -> str:
    """One target's line: ``  [PASS] name: detail`` (MISS, or ``n/a `` when it could not be judged)."""
    return f"  [{mark(ok)}] {name}: {detail}"


@dataclass
class Row:
    """One row of a benchmark's table: a load cell (client side, and the server's figures over the whole
    cell), a raw pass, or a row that could not be measured (``sentences_per_s`` None, ``note`` says why).
    CPU figures per sentence are per input the service computed."""

    label: str
    kind: str = "service"
    clients: int = 0
    texts: int = 0
    encoding: str = "float"
    workers: int = 1
    sentences_per_s: float | None = None
    requests_per_s: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    errors: int | None = None
    requests: int = 0
    first_error: str | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    client_cores: float | None = None
    server_cpu_s: float = NAN
    wall_s: float = NAN
    mean_batch: float = NAN
    computed: float = NAN  # inputs the service ran through the encoder during the whole cell
    session_run_s: float = NAN  # the inference thread's CPU inside Session.run
    inference_wall_s: float = NAN  # the wall time inside Session.run, summed over workers
    workers_ready: float = NAN
    tokenize_us: float = NAN  # the floor (loadtest.overhead.floor), per sentence
    write_us: float = NAN
    useful_gflops: float | None = None
    peak_share: float | None = None
    vs_raw: float | None = None
    vs_naive: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, m: Measured, kind: str = "service", workers: int = 1, label: str = "") -> Row:
        """The row of a measured cell (labelled as the cell, unless ``label``); its note says when the rate
        is noise."""
        r = m.load
        return cls(
            label=label or m.cell.label,
            kind=kind,
            clients=m.cell.clients,
            texts=m.cell.texts,
            encoding=m.cell.encoding,
            workers=workers,
            sentences_per_s=r.sentences_per_s,
            requests_per_s=r.requests_per_s,
            p50_ms=r.percentile(50),
            p90_ms=r.percentile(90),
            p99_ms=r.percentile(99),
            errors=r.errors,
            requests=r.requests,
            first_error=r.first_error,
            status_counts={str(k): v for k, v in r.status_counts.items()},
            client_cores=r.client_cores,
            server_cpu_s=m.server_cpu_s,
            wall_s=m.wall_s,
            mean_batch=m.mean_batch if m.after else NAN,
            computed=m.computed if m.after else NAN,
            session_run_s=m.run_cpu_s if m.after else NAN,
            inference_wall_s=m.delta(INFERENCE_SUM) if m.after else NAN,
            workers_ready=m.after.get(WORKERS_READY, NAN),
            note=reliability_warning(r) or "",
        )

    def per_sentence(self, seconds: float) -> float:
        return 1e6 * seconds / self.computed if self.computed else NAN

    @property
    def server_cores(self) -> float:
        return self.server_cpu_s / self.wall_s if self.wall_s else NAN

    @property
    def cpu_us(self) -> float:
        return self.per_sentence(self.server_cpu_s)

    @property
    def run_us(self) -> float:
        return self.per_sentence(self.session_run_s)

    @property
    def outside_us(self) -> float:
        return self.cpu_us - self.run_us

    @property
    def floor_us(self) -> float:
        return self.tokenize_us + self.write_us

    @property
    def machinery_us(self) -> float:
        return self.outside_us - self.floor_us

    @property
    def busy(self) -> float:
        """The inference thread's busy share per worker: its wall time in ``Session.run`` over the cell."""
        return self.inference_wall_s / self.wall_s / self.workers if self.wall_s else NAN

    @property
    def failed(self) -> bool:
        return bool(self.errors) or not self.requests or self.workers_ready != self.workers

    def notes(self, *more: str) -> str:
        """The note, ``more``, and the first error, joined."""
        return joined(self.note, *more, f"first error: {self.first_error[:100]}" if self.first_error else "")

    def as_json(self) -> dict[str, Any]:
        per = ("cpu", "session_run", "outside", "floor", "machinery")
        us = (self.cpu_us, self.run_us, self.outside_us, self.floor_us, self.machinery_us)
        derived = {f"{k}_us_per_sentence": v for k, v in zip(per, us, strict=True)}
        return {**asdict(self), **derived, "server_cores": self.server_cores, "busy": self.busy}


def cell(value: float | None, fmt: str, width: int) -> str:
    """``value`` formatted to ``width``, or a right-aligned dash when it is None or NaN."""
    return f"{value:>{width}{fmt}}" if value is not None and value == value else f"{'-':>{width}}"


@dataclass(frozen=True)
class Column:
    """A column of a printed table: its title, width and format, and the row attribute (or ``extra`` entry)
    it shows (None or NaN prints as a dash)."""

    title: str
    width: int
    fmt: str
    attr: str

    def cell(self, row: Row) -> str:
        return cell(getattr(row, self.attr, row.extra.get(self.attr)), self.fmt, self.width)


# The columns that more than one table shows, by title.
COLUMNS = {
    c.title: c
    for c in (
        Column("sent/s", 9, ".1f", "sentences_per_s"),
        Column("req/s", 9, ".1f", "requests_per_s"),
        *(Column(f"p{q} ms", 8, ".1f", f"p{q}_ms") for q in (50, 90, 99)),
        Column("err", 5, "d", "errors"),
        Column("batch", 6, ".1f", "mean_batch"),
        Column("srv cpu", 7, ".2f", "server_cores"),
        Column("cli cpu", 7, ".2f", "client_cores"),
        Column("us/sent", 8, ".0f", "cpu_us"),
        Column("in run", 7, ".0f", "run_us"),
        Column("outside", 8, ".0f", "outside_us"),
    )
}


class Table:
    """A printed table of rows: the label left-aligned in ``width``, the columns (a title stands for its
    column in ``COLUMNS``), then free text under ``tail``."""

    def __init__(self, label: str, width: int, *columns: Column | str, tail: str = "note") -> None:
        self.label, self.width, self.tail = label, width, tail
        self.columns = [COLUMNS[c] if isinstance(c, str) else c for c in columns]

    @property
    def header(self) -> str:
        return self.line(self.label, [f"{c.title:>{c.width}}" for c in self.columns], self.tail)

    def row(self, row: Row, note: str | None = None) -> str:
        """``row``'s line, ending in ``note`` (default: its notes)."""
        return self.line(
            row.label, [c.cell(row) for c in self.columns], row.notes() if note is None else note
        )

    def line(self, label: str, cells: list[str], tail: str) -> str:
        return f"{label:<{self.width}} {' '.join(cells)}  {tail}".rstrip()


@dataclass(frozen=True)
class Goal:
    """A target on the row labelled ``row``: its ``figure`` (an attribute's name, or a function of the
    row), over ``per`` for a ratio, ``op`` ``bound``. ``shown`` formats the value, and by name the figure
    (``raw``), ``per`` and ``bound``."""

    name: str
    row: str
    figure: str | Callable[[Row], Any]
    op: Literal[">=", "<="]
    bound: float
    shown: str = "{:.2f}"
    per: float | None = 1.0

    def line(self, rows: Mapping[str, Row], missing: str = "not measured") -> str:
        """Its :func:`target` line, judged on ``rows`` by label; n/a (``missing``) where the row, its
        figure, ``per`` or the bound is not known."""
        row = rows.get(self.row)
        raw = (
            None if row is None else self.figure(row) if callable(self.figure) else getattr(row, self.figure)
        )
        if raw is None or raw != raw or not self.per or self.bound != self.bound:
            return target(self.name, None, missing)
        value = raw / self.per
        ok = value >= self.bound if self.op == ">=" else value <= self.bound
        return target(self.name, ok, self.shown.format(value, raw=raw, per=self.per, bound=self.bound))


def write_json(report: dict[str, Any], out: Path | None, name: str) -> Path:
    """``report`` to ``out``, or to ``loadtest/results/<name>-<time>.json``; prints and returns the path."""
    path = out or RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=float))
    print(f"JSON: {path}")
    return path
