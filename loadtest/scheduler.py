"""The scheduler's cells against the raw ceiling and another tree's service (``--today``), as ratios.

    python -m loadtest.scheduler [--model DIR] [--today TREE] [--today-all] [--duration 20] [--warmup 3] \
        [--background 64x32] [--floor] [--quick]

Prints a line per cell (sentences/s counted by the server, p50 / p99 ms, mean batch, engine tokens/s),
then a table of issue 28's targets (target, this branch, against, ratio, goal, PASS / MISS), the cells
whose engine ran under 0.8 of the run's median speed (DISTURBED), and JSON in loadtest/results/.
docs/performance.md says what each cell is and why.

``--floor`` runs the background-floor cells alone (issue 50), on this tree's service and, with ``--today``,
on that tree's, in turns: interactive 8 x 1 alone, the u=7 background alone (its sentences/s there are the
engine's capacity for it), both at once, and interactive alone again (its reference is the mean of its
two rounds, as the machine drifts). Its targets, per service: the background's sentences/s in
whole requests (counted by the client, as answers came) beside the interactive load at least
``background_share`` (0.1) of its capacity, whole requests finished, and the interactive p99 beside it
within 1.5 x its p99 alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import operator
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
from loadtest.harness import TWIN, parser
from loadtest.harness.cell import STRIDE, Cell, closed_loops, distinct_bodies, parse_cells
from loadtest.harness.measure import Measured
from loadtest.harness.report import NAN, RESULTS, Column, Row, Table, mark, write_json
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.raw_onnx import ceiling
from loadtest.server import ServiceProcess, get

QUEUED = "zhembed_queue_duration_seconds_count"
# A cell whose engine ran the model at under this share of the run's median speed is reported as disturbed.
DISTURBED = 0.8
# sent/s is counted by the server (inputs it queued in the window), client/s by the client.
CLIENT = Column("client/s", 9, ".1f", "client_sentences_per_s")
ANSWERS = Column("answers", 8, "d", "requests")
ENGINE = Column("engine tok/s", 13, ".0f", "engine_tokens_per_s")
TABLE = Table("cell", 34, "sent/s", CLIENT, "p50 ms", "p99 ms", ANSWERS, "err", "batch", ENGINE, tail="")


def raw_ceiling(opts: argparse.Namespace, texts: list[str], when: str) -> dict[int, float]:
    """Sentences/s of the bare session on ``texts`` at batch sizes 8 and 32, tokenising included."""
    print(
        f"raw ceiling, {opts.variant}, {len(texts)} distinct texts, tokenising included ({when})", flush=True
    )
    out: dict[int, float] = {}
    for size in (8, 32):
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
    svc: ServiceProcess, cells: dict[str, Cell], opts: argparse.Namespace, starts: Iterator[int]
) -> dict[str, Row]:
    """Every named cell's clients at once, on ``svc``; each cell's row, by its name."""
    wait_idle(svc)
    before = svc.engine_stats()
    loads = [(svc.port, c, distinct_bodies(opts.corpus, c.texts, next(starts))) for c in cells.values()]

    async def main() -> tuple[list[loadgen.CellResult], dict[str, float], dict[str, float]]:
        load = asyncio.ensure_future(closed_loops(loads, opts.duration, opts.warmup))
        await asyncio.sleep(opts.warmup)
        first = _queued_by_urgency(await asyncio.to_thread(svc.metrics))
        await asyncio.sleep(opts.duration)
        return await load, first, _queued_by_urgency(await asyncio.to_thread(svc.metrics))

    results, first, last = uvloop.run(main())
    after = svc.engine_stats()
    moved = {k: v - before.get(k, 0) for k, v in after.items() if type(v) in (int, float)}
    mean_batch = moved["batched_items"] / moved["batches"] if moved.get("batches") else NAN
    # Tokens computed (padding included) per second inside Session.run: how fast the machine ran the model.
    busy = moved.get("inference_busy_s", 0.0)
    speed = moved.get("padded_tokens", 0) / busy if busy else NAN
    rows = {}
    for (name, c), result in zip(cells.items(), results, strict=True):
        key = str(c.urgency or 3) if str(c.urgency or 3) in last else "all"
        row = rows[name] = Row.of(Measured(c, result, NAN, NAN, {}, {}), label=name)
        row.sentences_per_s = (last.get(key, 0.0) - first.get(key, 0.0)) / opts.duration
        row.mean_batch = mean_batch
        row.extra.update(client_sentences_per_s=result.sentences_per_s, engine=moved)
        row.extra["engine_tokens_per_s"] = speed
        print(TABLE.row(row, ""), flush=True)
    return rows


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


def cost_model(svc: ServiceProcess, title: str) -> dict[str, Any] | None:
    """The service's batching settings and cost model (``/info``'s ``batching``), printed; None where none."""
    answer = get(svc.port, "/info")
    if answer.status_code != 200:
        return None
    info = answer.json()
    batching: dict[str, Any] = info["batching"]
    m = batching["cost_model"]
    print(
        f"{title} ({m['source']}; refitted from {m.get('refitted_from_served_batches', 0)} served batches, "
        f"their error {m.get('served_error')}): {m['a']:.3f} + B x ({m['b']:.4f} + {m['c']:.4f} S + "
        f"{m['d']:.2e} S^2) {m['unit']}; grid fit error max {m['max_error']} mean {m['mean_error']}; "
        f"queue-delay budget {batching['queue_delay_budget_ms']} ms",
        flush=True,
    )
    return batching


def run(opts: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread, as the service tokenises
    corpus = load_corpus()
    raw_texts = unique_texts(random.Random(7).sample(corpus, len(corpus)), 90_000_000, opts.raw_texts)
    out: dict[str, Any] = {"raw_start": raw_ceiling(opts, raw_texts, "start"), "cells": {}}
    # Each cell sends texts from its own range of numbers.
    opts.corpus, starts = random.Random(0).sample(corpus, len(corpus)), itertools.count(0, STRIDE)
    (bg,) = opts.background
    background, interactive = Cell(bg.clients, bg.texts, urgency=7), Cell(8, 1)
    cells: dict[str, Row] = {}
    with contextlib.ExitStack() as stack:
        ours, today = servers(opts, bg.inputs + 64, stack)
        today_all = today if opts.today_all else None
        out["cost_model"] = cost_model(ours, "cost model at start")
        print(TABLE.header, flush=True)
        for svc, named in (
            (ours, {"ours 8x1 (1)": interactive}),
            (today, {"today 8x1 (1)": interactive}),
            (ours, {"ours 32x1": Cell(32, 1)}),
            (ours, {"ours 8x16": Cell(8, 16)}),
            (today_all, {"today 32x1": Cell(32, 1)}),
            (today_all, {"today 8x16": Cell(8, 16)}),
            (ours, {"background alone": background}),
            (ours, {"background mixed": background, "interactive mixed": interactive}),
            (ours, {"ours 8x1 (2)": interactive}),
            (today, {"today 8x1 (2)": interactive}),
        ):
            if svc is not None:
                cells.update(run_cells(svc, named, opts, starts))
        if (end := cost_model(ours, "cost model after the cells")) is not None:  # refitted from the batches
            out["cost_model_end"] = end
    out["raw_end"] = raw_ceiling(opts, raw_texts, "end")
    out["cells"] = {k: c.as_json() for k, c in cells.items()}
    out["summary"] = summarise(cells, out["raw_start"], out["raw_end"], today is not None)
    speeds = {k: c.extra["engine_tokens_per_s"] for k, c in cells.items()}
    median = float(np.nanmedian(list(speeds.values())))
    out["disturbed"] = [k for k, v in speeds.items() if v < DISTURBED * median]
    return out


def summarise(
    cells: dict[str, Row], raw_start: dict[int, float], raw_end: dict[int, float], have_today: bool
) -> list[dict[str, Any]]:
    """The issue's targets, each as (measured, ratio, target, PASS/MISS)."""
    rate = {k: c.sentences_per_s or 0.0 for k, c in cells.items()}
    spread = {k: (c.p99_ms or NAN) / (c.p50_ms or NAN) for k, c in cells.items()}
    p99 = {k: c.p99_ms or NAN for k, c in cells.items()}
    best = max(raw_start, key=lambda b: raw_start[b] + raw_end[b])
    raw = (raw_start[best] + raw_end[best]) / 2
    rows: list[dict[str, Any]] = []

    def rounds(figures: dict[str, float], who: str) -> float:  # the mean of 8x1's two rounds
        return (figures[f"{who} 8x1 (1)"] + figures[f"{who} 8x1 (2)"]) / 2

    def row(what: str, ours: float, against: float | None, goal: str = "") -> None:
        target(rows, what, ours, against, goal)

    for key in ("32x1", "8x16"):
        row(f"{key} sentences/s vs raw b={best}", rate[f"ours {key}"], raw, ">= 0.95")
    row("8x1 p99 / p50 (rounds 1, 2)", rounds(spread, "ours"), None, "<= 1.6")
    if have_today:
        row("8x1 sentences/s vs today's", rounds(rate, "ours"), rounds(rate, "today"), ">= 1.05")
        row("today's 8x1 p99 / p50 (for reference)", rounds(spread, "today"), None)
        for key in ("today 32x1", "today 8x16"):
            if key in cells:
                row(f"{key} sentences/s vs raw (for reference)", rate[key], raw)
    idle, alone = rounds(p99, "ours"), rate["background alone"]
    row("interactive 8x1 p99 beside background vs idle", p99["interactive mixed"], idle, "<= 1.5")
    row("background sentences/s beside interactive vs alone", rate["background mixed"], alone, ">= 0.7")
    return rows


def run_floor(opts: argparse.Namespace) -> dict[str, Any]:
    """The background-floor cells on ours and (``--today``) today's, in turns; their rows and targets."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    corpus = load_corpus()
    opts.corpus, starts = random.Random(0).sample(corpus, len(corpus)), itertools.count(0, STRIDE)
    (bg,) = opts.background
    background, interactive = Cell(bg.clients, bg.texts, urgency=7), Cell(8, 1)
    cells: dict[str, Row] = {}
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        ours, today = servers(opts, bg.inputs + 64, stack)
        services = [("ours", ours)] + ([("today", today)] if today is not None else [])
        out["cost_model"] = cost_model(ours, "cost model at start")
        print(TABLE.header, flush=True)
        for step in ("interactive alone (1)", "background alone", "mixed", "interactive alone (2)"):
            for who, svc in services:
                named = {
                    "interactive alone (1)": {f"{who} interactive alone (1)": interactive},
                    "interactive alone (2)": {f"{who} interactive alone (2)": interactive},
                    "background alone": {f"{who} background alone": background},
                    "mixed": {f"{who} background mixed": background, f"{who} interactive mixed": interactive},
                }[step]
                cells.update(run_cells(svc, named, opts, starts))
    out["cells"] = {k: c.as_json() for k, c in cells.items()}
    out["summary"] = [row for who, _ in services for row in summarise_floor(cells, who)]
    speeds = {k: c.extra["engine_tokens_per_s"] for k, c in cells.items()}
    median = float(np.nanmedian(list(speeds.values())))
    out["disturbed"] = [k for k, v in speeds.items() if v < DISTURBED * median]
    return out


def summarise_floor(cells: dict[str, Row], who: str) -> list[dict[str, Any]]:
    """Issue 50's background-floor targets for ``who`` ("ours" or "today")."""

    def client(name: str) -> float:  # sentences/s of whole requests, as the client got their answers
        return float(cells[f"{who} {name}"].extra["client_sentences_per_s"])

    mixed, alone = cells[f"{who} background mixed"], cells[f"{who} background alone"]
    rounds = [cells[f"{who} interactive alone ({n})"] for n in (1, 2)]  # before and after: the drift
    p99 = {"mixed": cells[f"{who} interactive mixed"].p99_ms or NAN}
    p99["alone"] = sum(r.p99_ms or NAN for r in rounds) / 2
    alone_rate = sum(float(r.extra["client_sentences_per_s"]) for r in rounds) / 2
    rows: list[dict[str, Any]] = []
    target(
        rows,
        f"{who}: background whole-request sent/s beside vs alone",
        client("background mixed"),
        client("background alone"),
        ">= 0.10",
    )
    target(
        rows, f"{who}: background requests finished beside interactive", float(mixed.requests), None, ">= 1"
    )
    target(rows, f"{who}: interactive p99 beside background vs alone", p99["mixed"], p99["alone"], "<= 1.5")
    target(
        rows,
        f"{who}: background inputs computed beside vs alone",
        mixed.sentences_per_s or 0.0,
        alone.sentences_per_s or NAN,
    )
    target(
        rows, f"{who}: interactive sent/s beside background vs alone", client("interactive mixed"), alone_rate
    )
    return rows


def target(rows: list[dict[str, Any]], what: str, ours: float, against: float | None, goal: str = "") -> None:
    """Append ``ours`` over ``against`` (None: ``ours`` is the ratio), held to ``goal`` ("": for reference)."""
    ratio = ours if against is None else (ours / against if against else NAN)
    ok = {">=": operator.ge, "<=": operator.le}[goal[:2]](ratio, float(goal[3:])) if goal else None
    rows.append({"what": what, "ours": ours, "against": against, "ratio": ratio, "target": goal, "ok": ok})


def print_summary(rows: list[dict[str, Any]]) -> None:
    print(f"\n| {'target':<56} | {'this branch':>11} | {'against':>9} | {'ratio':>6} | {'goal':>7} | |")
    print(f"|{'-' * 58}|{'-' * 13}|{'-' * 11}|{'-' * 8}|{'-' * 9}|---|")
    for r in rows:
        against = f"{r['against']:.1f}" if r["against"] is not None else ""
        verdict = "" if r["ok"] is None else mark(r["ok"])
        print(
            f"| {r['what']:<56} | {r['ours']:>11.2f} | {against:>9} | {r['ratio']:>6.2f} | {r['target']:>7} | {verdict} |"
        )


def main(argv: list[str] | None = None) -> int:
    quick = "a tiny model and short cells (a CI test)"
    p = parser("loadtest.scheduler", __doc__, quick, model=TWIN, duration=20.0, warmup=3.0, out=None)
    p.add_argument("--variant", default="int8")
    p.add_argument("--today", type=Path, default=None, help="another checkout to measure as today's")
    p.add_argument("--today-all", action="store_true", help="today's 32x1 and 8x16 too")
    p.add_argument("--raw-texts", type=int, default=320, help="texts of each raw pass")
    p.add_argument("--raw-seconds", type=float, default=5.0, help="least seconds of raw passes per size")
    p.add_argument("--background", type=parse_cells, default="64x32", help="clients x texts, at u=7")
    p.add_argument("--floor", action="store_true", help="the background-floor cells alone (issue 50)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.raw_texts, args.raw_seconds = 1.5, 0.5, 64, 0.2
        args.background = parse_cells("8x4")
    with (
        tempfile.TemporaryDirectory(prefix="zhembed-sched-") as tmp,
        tiny_model(None, ("int8",), 3) if args.quick else contextlib.nullcontext(args.model) as model,
    ):
        # The cost model is measured afresh in every run, and written only under the run's own folder.
        args.model = linked(model, Path(tmp) / "model")
        args.logs, args.cost_cache = RESULTS / "logs", Path(tmp) / "cache"
        result = run_floor(args) if args.floor else run(args)
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
