"""The scheduler's cells against the raw ceiling and another tree's service (``--today``), as ratios.

    python -m loadtest.scheduler [--model DIR] [--today TREE] [--today-all] [--duration 20] [--warmup 3] \
        [--background 64x32] [--quick]

Prints a line per cell (sentences/s counted by the server, p50 / p99 ms, mean batch, engine tokens/s),
then a table of issue 28's targets (target, this branch, against, ratio, goal, PASS / MISS), the cells
whose engine ran under 0.8 of the run's median speed (DISTURBED), and JSON in loadtest/results/.
docs/performance.md says what each cell is and why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from loadtest import loadgen
from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness import parser
from loadtest.harness.cell import STRIDE, Cell, distinct_bodies, parse_cells
from loadtest.harness.report import RESULTS, Row, mark, write_json
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.raw_onnx import DEFAULT_MODEL, ceiling
from loadtest.server import HOST, ServiceProcess, scrape

QUEUED = "zhembed_queue_duration_seconds_count"
# A cell whose engine ran the model at under this share of the run's median speed is reported as disturbed.
DISTURBED = 0.8


def raw_ceiling(opts: argparse.Namespace, texts: list[str], batch_sizes: tuple[int, ...]) -> dict[int, float]:
    """Sentences/s of the bare session on ``texts`` at each batch size, tokenising included (see module)."""
    out: dict[int, float] = {}
    for size in batch_sizes:
        got = ceiling(opts.model, opts.variant, texts, size, opts.raw_seconds, tokenize=True)
        out[size] = got.sentences_per_s
        print(f"  raw b={size}: {out[size]:.1f} sentences/s ({got.passes} pass(es))", flush=True)
    return out


def _queued_by_urgency(series: dict[str, float]) -> dict[str, float]:
    """Inputs computed so far, by urgency ("all" where the server has no urgency label: today's)."""
    out: dict[str, float] = {}
    for name, value in series.items():
        if name.startswith(QUEUED):
            label = name.partition('urgency="')[2].partition('"')[0] or "all"
            out[label] = out.get(label, 0.0) + value
    return out


def wait_idle(svc: ServiceProcess, timeout_s: float = 120.0) -> None:
    """Until the server has nothing in flight (what a previous cell left is cancelled or done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = svc.engine_stats()
        if stats.get("inputs_in_flight", 1) == 0 and stats.get("queue_depth", 1) == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server on port {svc.port} did not go idle in {timeout_s:.0f} s")


def run_cells(
    svc: ServiceProcess, groups: list[tuple[str, Cell]], opts: argparse.Namespace, starts: Iterator[int]
) -> list[Row]:
    """One cell: every group's clients at once. A group: (name, what its clients send)."""
    wait_idle(svc)
    before = svc.engine_stats()

    async def main() -> tuple[list[loadgen.CellResult], dict[str, float], dict[str, float]]:
        tasks = [
            asyncio.create_task(
                loadgen.run_cell(
                    HOST,
                    svc.port,
                    c.route,
                    distinct_bodies(opts.corpus, c.texts, next(starts)),
                    c.clients,
                    opts.duration,
                    opts.warmup,
                    drain_s=2.0 if c.texts > 1 else 30.0,
                    headers=c.headers,
                )
            )
            for _, c in groups
        ]
        await asyncio.sleep(opts.warmup)
        first = _queued_by_urgency(await scrape(svc.port))
        await asyncio.sleep(opts.duration)
        last = _queued_by_urgency(await scrape(svc.port))
        return list(await asyncio.gather(*tasks)), first, last

    results, first, last = uvloop.run(main())
    after = svc.engine_stats()
    moved = {k: v - before.get(k, 0) for k, v in after.items() if type(v) in (int, float)}
    mean_batch = moved["batched_items"] / moved["batches"] if moved.get("batches") else float("nan")
    cells = []
    for (name, c), result in zip(groups, results, strict=True):
        key = str(c.urgency or 3) if str(c.urgency or 3) in last else "all"
        rate = (last.get(key, 0.0) - first.get(key, 0.0)) / opts.duration  # counted by the server
        row = Row(
            name,
            clients=c.clients,
            texts=c.texts,
            sentences_per_s=rate,
            p50_ms=result.percentile(50),
            p99_ms=result.percentile(99),
            requests=result.requests,
            errors=result.errors,
            status_counts={str(k): v for k, v in result.status_counts.items()},
            extra={"client_sentences_per_s": result.sentences_per_s, "engine": moved},
        )
        print(
            f"  {name:<34} {rate:7.1f} sentences/s (client {result.sentences_per_s:.1f})"
            f"  p50 {row.p50_ms:7.0f} ms  p99 {row.p99_ms:7.0f} ms  {row.requests} answers, "
            f"{row.errors} errors; mean batch {mean_batch:.1f}; engine {engine_speed(row):.0f} tokens/s",
            flush=True,
        )
        cells.append(row)
    return cells


def linked(model: Path, into: Path) -> Path:
    """A folder of links to ``model``'s files: the service caches its batch cost model beside the export,
    here in the run's own folder, never in the model's (which may be shared, and read-only)."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in model.iterdir():
        if entry.is_file():
            (into / entry.name).symlink_to(entry.resolve())
    return into


def servers(
    opts: argparse.Namespace, peak_inputs: int, stack: contextlib.ExitStack
) -> tuple[ServiceProcess, ServiceProcess | None]:
    """Ours, and today's where ``--today`` names it, started one after the other: the cost model is
    measured on a quiet machine. Room for every client group at once: these cells measure scheduling, not
    refusals. The batch cost model goes under the run's own folder."""
    env = service_env(opts.model, opts.variant, 2 * peak_inputs, cache_dir=opts.cost_cache)
    here = Path(__file__).parents[1]
    ours = stack.enter_context(ServiceProcess("app", env, opts.logs / "scheduler-ours.log", cwd=here))
    if opts.today is None:
        return ours, None
    today_env = {**env, "PYTHONPATH": str(opts.today)}
    log = opts.logs / "scheduler-today.log"
    return ours, stack.enter_context(ServiceProcess("app", today_env, log, cwd=opts.today))


def run(opts: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread, as the service tokenises
    corpus = load_corpus()
    raw_texts = unique_texts(random.Random(7).sample(corpus, len(corpus)), 90_000_000, opts.raw_texts)
    print(
        f"raw ceiling, {opts.variant}, {len(raw_texts)} distinct texts, tokenising included (start)",
        flush=True,
    )
    raw_start = raw_ceiling(opts, raw_texts, (8, 32))
    # Each group of each cell sends texts from its own range of numbers.
    opts.corpus, starts = random.Random(0).sample(corpus, len(corpus)), itertools.count(0, STRIDE)
    (bg,) = opts.background
    out: dict[str, Any] = {"raw_start": raw_start, "cells": {}}
    cells: dict[str, Row] = {}
    with contextlib.ExitStack() as stack:
        ours, today = servers(opts, bg.inputs + 64, stack)
        status, info = asyncio.run(loadgen.get_json(HOST, ours.port, "/info"))
        out["cost_model"] = info["batching"] if status == 200 and isinstance(info, dict) else None
        if out["cost_model"] is not None:
            print_model("cost model at start", out["cost_model"])

        def one(svc: ServiceProcess, key: str, clients: int, texts: int) -> None:
            (cells[key],) = run_cells(svc, [(key, Cell(clients, texts))], opts, starts)

        print("cells", flush=True)
        one(ours, "ours 8x1 (1)", 8, 1)
        if today is not None:
            one(today, "today 8x1 (1)", 8, 1)
        one(ours, "ours 32x1", 32, 1)
        one(ours, "ours 8x16", 8, 16)
        if today is not None and opts.today_all:
            one(today, "today 32x1", 32, 1)
            one(today, "today 8x16", 8, 16)
        background = ("background", Cell(bg.clients, bg.texts, urgency=7))
        (cells["background alone"],) = run_cells(ours, [background], opts, starts)
        mixed = run_cells(ours, [background, ("interactive", Cell(8, 1))], opts, starts)
        cells["background mixed"], cells["interactive mixed"] = mixed
        one(ours, "ours 8x1 (2)", 8, 1)
        if today is not None:
            one(today, "today 8x1 (2)", 8, 1)
        status, info = asyncio.run(loadgen.get_json(HOST, ours.port, "/info"))
        if status == 200 and isinstance(info, dict):  # after the cells: refitted from the batches served
            out["cost_model_end"] = info["batching"]
            print_model("cost model after the cells", info["batching"])
    print("raw ceiling (end)", flush=True)
    raw_end = raw_ceiling(opts, raw_texts, (8, 32))
    out["raw_end"] = raw_end
    out["cells"] = {k: c.as_json() for k, c in cells.items()}
    out["summary"] = summarise(cells, raw_start, raw_end, today is not None)
    speeds = {k: engine_speed(c) for k, c in cells.items()}
    median = float(np.nanmedian(list(speeds.values())))
    out["disturbed"] = [k for k, v in speeds.items() if v < DISTURBED * median]
    return out


def engine_speed(cell: Row) -> float:
    """Tokens computed (padding included) per second inside ``Session.run`` over the cell: how fast the
    machine ran the model then. A cell far below the run's others had the cores shared with other work."""
    engine = cell.extra.get("engine", {})
    busy = engine.get("inference_busy_s", 0.0)
    return engine.get("padded_tokens", 0) / busy if busy else float("nan")


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
    cells: dict[str, Row], raw_start: dict[int, float], raw_end: dict[int, float], have_today: bool
) -> list[dict[str, Any]]:
    """The issue's targets, each as (measured, ratio, target, PASS/MISS)."""
    nan = float("nan")
    rate = {k: c.sentences_per_s or 0.0 for k, c in cells.items()}
    spread = {k: (c.p99_ms or nan) / (c.p50_ms or nan) for k, c in cells.items()}
    raw = max(_mean(raw_start[b], raw_end[b]) for b in raw_start)
    best = max(raw_start, key=lambda b: _mean(raw_start[b], raw_end[b]))
    ours_8x1, today_8x1 = ("ours 8x1 (1)", "ours 8x1 (2)"), ("today 8x1 (1)", "today 8x1 (2)")
    idle_p99 = _mean(*(cells[k].p99_ms or nan for k in ours_8x1))
    rows: list[dict[str, Any]] = []

    def row(*values: Any) -> None:  # what, ours, against, ratio, target, ok
        rows.append(dict(zip(("what", "ours", "against", "ratio", "target", "ok"), values, strict=True)))

    for key in ("ours 32x1", "ours 8x16"):
        ratio = rate[key] / raw
        row(f"{key[5:]} sentences/s vs raw b={best}", rate[key], raw, ratio, ">= 0.95", ratio >= 0.95)
    ours = _mean(*(spread[k] for k in ours_8x1))
    row("8x1 p99 / p50 (rounds 1, 2)", ours, None, ours, "<= 1.6", ours <= 1.6)
    if have_today:
        ours_rate, today_rate = _mean(*(rate[k] for k in ours_8x1)), _mean(*(rate[k] for k in today_8x1))
        ratio = ours_rate / today_rate
        row("8x1 sentences/s vs today's", ours_rate, today_rate, ratio, ">= 1.05", ratio >= 1.05)
        today = _mean(*(spread[k] for k in today_8x1))
        row("today's 8x1 p99 / p50 (for reference)", today, None, today, "", None)
        for key in ("today 32x1", "today 8x16"):
            if key in cells:
                row(f"{key} sentences/s vs raw (for reference)", rate[key], raw, rate[key] / raw, "", None)
    mixed_p99 = cells["interactive mixed"].p99_ms or nan
    ratio = mixed_p99 / idle_p99
    row("interactive 8x1 p99 beside background vs idle", mixed_p99, idle_p99, ratio, "<= 1.5", ratio <= 1.5)
    alone, beside = rate["background alone"], rate["background mixed"]
    ratio = beside / alone if alone else nan
    row("background sentences/s beside interactive vs alone", beside, alone, ratio, ">= 0.7", ratio >= 0.7)
    return rows


def print_summary(rows: list[dict[str, Any]]) -> None:
    print()
    print(f"| {'target':<52} | {'this branch':>11} | {'against':>9} | {'ratio':>6} | {'goal':>7} | |")
    print(f"|{'-' * 54}|{'-' * 13}|{'-' * 11}|{'-' * 8}|{'-' * 9}|---|")
    for r in rows:
        against = f"{r['against']:.1f}" if r["against"] is not None else ""
        verdict = "" if r["ok"] is None else mark(r["ok"])
        print(
            f"| {r['what']:<52} | {r['ours']:>11.2f} | {against:>9} | {r['ratio']:>6.2f} | {r['target']:>7} | {verdict} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.scheduler", __doc__)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--variant", default="int8")
    p.add_argument("--today", type=Path, default=None, help="another checkout to measure as today's")
    p.add_argument("--today-all", action="store_true", help="today's 32x1 and 8x16 too")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each cell counts")
    p.add_argument("--raw-texts", type=int, default=320, help="texts of each raw pass")
    p.add_argument("--raw-seconds", type=float, default=5.0, help="least seconds of raw passes per size")
    p.add_argument("--background", type=parse_cells, default="64x32", help="clients x texts, at u=7")
    p.add_argument("--quick", action="store_true", help="a tiny model and short cells (a CI test)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zhembed-sched-") as tmp:
        args.logs, args.cost_cache = RESULTS / "logs", Path(tmp) / "cache"
        if args.quick:
            with tiny_model(None, ("int8",), 3) as args.model:
                args.duration, args.warmup, args.raw_texts, args.raw_seconds = 1.5, 0.5, 64, 0.2
                args.background = parse_cells("8x4")
                result = run(args)
        else:  # the cost model is measured afresh in every run, and written only under the run's own folder
            args.model = linked(args.model, Path(tmp) / "model")
            result = run(args)
    print_summary(result["summary"])
    if result["disturbed"]:
        print(
            f"\nDISTURBED (the engine ran under {DISTURBED:.0%} of the run's median tokens/s: other work on the "
            f"cores): {', '.join(result['disturbed'])}"
        )
    print()
    write_json(result, args.out, "scheduler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
