"""The rows of ``loadtest.gpu_check``'s service table: what a cell holds, how it prints, and issue 13's
GPU targets drawn from the main cells."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loadtest.table import cell

# The gauge read after each cell: how many workers served it (must equal the workers asked for).
WORKERS_READY = "zhembed_workers_ready"
# The issue's GPU targets.
MIN_SENTENCES_X32 = 20_000.0
MIN_RAW_SHARE_X32 = 0.5
MAX_P99_MS_X32 = 2000.0
MIN_REQUESTS_X1 = 5_000.0
MAX_P50_MS_1X1 = 4.0
MAX_P99_MS_1X1 = 10.0
# A client at this many cores or more may be what limits its cell.
CLIENT_BOUND_CORES = 0.9


@dataclass
class Cell:
    """One cell as measured; ``busy`` is per worker (``loadtest.gpu_check``'s docstring says how)."""

    label: str
    clients: int
    texts: int
    encoding: str
    workers: int
    workers_ready: float
    sentences_per_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int
    first_error: str | None
    status_counts: dict[str, int]
    mean_batch: float
    busy: float
    server_cores: float
    client_cores: float
    wall_s: float
    note: str

    @property
    def failed(self) -> bool:
        return bool(self.errors) or not self.requests or self.workers_ready != self.workers


HEADER = (
    f"{'cell':<16}{'wrk':>4}{'sent/s':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'err':>5}{'batch':>7}"
    f"{'busy':>6}{'srv cpu':>8}{'cli cpu':>8}  note"
)


def format_cell(c: Cell) -> str:
    return (
        f"{c.label:<16}{cell(c.workers, 'd', 4)}{cell(c.sentences_per_s, '.0f', 9)}"
        f"{cell(c.requests_per_s, '.0f', 9)}{cell(c.p50_ms, '.1f', 9)}{cell(c.p99_ms, '.1f', 9)}"
        f"{cell(c.errors, 'd', 5)}{cell(c.mean_batch, '.1f', 7)}{cell(c.busy, '.2f', 6)}"
        f"{cell(c.server_cores, '.2f', 8)}{cell(c.client_cores, '.2f', 8)}  "
        + "; ".join(
            x
            for x in (
                c.note,
                "" if c.workers_ready == c.workers else f"{WORKERS_READY} {c.workers_ready:g}",
                f"first error: {c.first_error[:100]}" if c.first_error else "",
            )
            if x
        )
    )


def targets(main: dict[str, Cell], clients: int, ceiling: float) -> list[str]:
    """The issue's GPU targets, each with its measured value; ``main`` holds the main cells by label (a
    missing one, from a service that did not start, makes its targets n/a)."""
    out: list[str] = []

    def say(name: str, label: str, test: Callable[[Cell], tuple[bool, str]]) -> None:
        c = main.get(label)
        if c is None:
            out.append(f"  [n/a ] {name}: not measured")
            return
        ok, detail = test(c)
        if c.client_cores >= CLIENT_BOUND_CORES:
            detail += f" (client at {c.client_cores:.2f} cores: it may be the limit)"
        out.append(f"  [{'PASS' if ok else 'MISS'}] {name}: {detail}")

    many, single = f"{clients}x32", f"{clients}x1"
    say(
        f"{many} >= {MIN_SENTENCES_X32:,.0f} sentences/s",
        many,
        lambda c: (c.sentences_per_s >= MIN_SENTENCES_X32, f"{c.sentences_per_s:,.0f}"),
    )
    say(
        f"{many} >= {MIN_RAW_SHARE_X32} x raw ceiling",
        many,
        lambda c: (
            c.sentences_per_s >= MIN_RAW_SHARE_X32 * ceiling,
            f"{c.sentences_per_s / ceiling:.2f} ({c.sentences_per_s:,.0f} / {ceiling:,.0f})",
        ),
    )
    say(
        f"{many} p99 <= {MAX_P99_MS_X32:.0f} ms",
        many,
        lambda c: (c.p99_ms <= MAX_P99_MS_X32, f"{c.p99_ms:.0f} ms"),
    )
    say(
        f"{single} >= {MIN_REQUESTS_X1:,.0f} requests/s",
        single,
        lambda c: (c.requests_per_s >= MIN_REQUESTS_X1, f"{c.requests_per_s:,.0f}"),
    )
    say(
        f"1x1 p50 <= {MAX_P50_MS_1X1:g} ms",
        "1x1",
        lambda c: (c.p50_ms <= MAX_P50_MS_1X1, f"{c.p50_ms:.2f} ms"),
    )
    say(
        f"1x1 p99 <= {MAX_P99_MS_1X1:g} ms",
        "1x1",
        lambda c: (c.p99_ms <= MAX_P99_MS_1X1, f"{c.p99_ms:.2f} ms"),
    )
    return out
