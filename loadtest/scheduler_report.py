"""The report of :mod:`loadtest.scheduler`: a cell's figures, the issue's targets as PASS / MISS, the table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A cell whose engine ran the model at under this share of the run's median speed is reported as disturbed.
DISTURBED = 0.8


@dataclass
class Cell:
    """What one client group measured in one cell."""

    name: str
    clients: int
    texts: int
    sentences_per_s: float = 0.0  # counted by the server, for this group's urgency
    client_sentences_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    requests: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)  # /info stats moved over the cell


def engine_speed(cell: Cell) -> float:
    """Tokens computed (padding included) per second inside ``Session.run`` over the cell: how fast the
    machine ran the model then. A cell far below the run's others had the cores shared with other work."""
    busy = cell.engine.get("inference_busy_s", 0.0)
    return cell.engine.get("padded_tokens", 0) / busy if busy else float("nan")


def print_model(title: str, batching: dict[str, Any]) -> None:
    m = batching["cost_model"]
    print(
        f"{title} ({m['source']}; refitted from {m.get('refitted_from_served_batches', 0)} served batches, "
        f"their error {m.get('served_error')}): {m['a']:.3f} + B x ({m['b']:.4f} + {m['c']:.4f} S + "
        f"{m['d']:.2e} S^2) {m['unit']}; grid fit error max {m['max_error']} mean {m['mean_error']}; "
        f"queue-delay budget {batching['queue_delay_budget_ms']} ms",
        flush=True,
    )


def _mean(*values: float) -> float:
    return float(np.mean(values))


def summarise(
    cells: dict[str, Cell], raw_start: dict[int, float], raw_end: dict[int, float], have_today: bool
) -> list[dict[str, Any]]:
    """The issue's targets, each as (measured, ratio, target, PASS/MISS)."""
    raw = max(_mean(raw_start[b], raw_end[b]) for b in raw_start)
    best = max(raw_start, key=lambda b: _mean(raw_start[b], raw_end[b]))
    ours_8x1 = [cells["ours 8x1 (1)"], cells["ours 8x1 (2)"]]
    idle_p99 = _mean(*(c.p99_ms for c in ours_8x1))
    rows: list[dict[str, Any]] = []

    def row(
        what: str, ours: float, against: float | None, ratio: float | None, target: str, ok: bool | None
    ) -> None:
        rows.append(
            {"what": what, "ours": ours, "against": against, "ratio": ratio, "target": target, "ok": ok}
        )

    for key in ("ours 32x1", "ours 8x16"):
        ratio = cells[key].sentences_per_s / raw
        row(
            f"{key[5:]} sentences/s vs raw b={best}",
            cells[key].sentences_per_s,
            raw,
            ratio,
            ">= 0.95",
            ratio >= 0.95,
        )
    spread = [c.p99_ms / c.p50_ms for c in ours_8x1]
    row("8x1 p99 / p50 (rounds 1, 2)", _mean(*spread), None, _mean(*spread), "<= 1.6", _mean(*spread) <= 1.6)
    if have_today:
        today = [cells["today 8x1 (1)"], cells["today 8x1 (2)"]]
        ours_rate = _mean(*(c.sentences_per_s for c in ours_8x1))
        today_rate = _mean(*(c.sentences_per_s for c in today))
        ratio = ours_rate / today_rate
        row("8x1 sentences/s vs today's", ours_rate, today_rate, ratio, ">= 1.05", ratio >= 1.05)
        today_spread = _mean(*(c.p99_ms / c.p50_ms for c in today))
        row("today's 8x1 p99 / p50 (for reference)", today_spread, None, today_spread, "", None)
        for key in ("today 32x1", "today 8x16"):
            if key in cells:
                r = cells[key].sentences_per_s / raw
                row(f"{key} sentences/s vs raw (for reference)", cells[key].sentences_per_s, raw, r, "", None)
    mixed_p99 = cells["interactive mixed"].p99_ms
    ratio = mixed_p99 / idle_p99
    row("interactive 8x1 p99 beside background vs idle", mixed_p99, idle_p99, ratio, "<= 1.5", ratio <= 1.5)
    alone, beside = cells["background alone"].sentences_per_s, cells["background mixed"].sentences_per_s
    ratio = beside / alone if alone else float("nan")
    row("background sentences/s beside interactive vs alone", beside, alone, ratio, ">= 0.7", ratio >= 0.7)
    return rows


def print_summary(rows: list[dict[str, Any]]) -> None:
    print()
    print(f"| {'target':<52} | {'this branch':>11} | {'against':>9} | {'ratio':>6} | {'goal':>7} | |")
    print(f"|{'-' * 54}|{'-' * 13}|{'-' * 11}|{'-' * 8}|{'-' * 9}|---|")
    for r in rows:
        against = f"{r['against']:.1f}" if r["against"] is not None else ""
        verdict = "" if r["ok"] is None else ("PASS" if r["ok"] else "MISS")
        print(
            f"| {r['what']:<52} | {r['ours']:>11.2f} | {against:>9} | {r['ratio']:>6.2f} | {r['target']:>7} | {verdict} |"
        )
