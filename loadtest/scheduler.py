"""Issue 28's cells and their ceilings in one run: what the scheduler buys, as ratios.

    python -m loadtest.scheduler [--model DIR] [--today TREE] [--duration 20] [--warmup 3] [--quick]

On one model (default: the bert-base-chinese shape twin, int8), cache off, closed-loop clients
(:mod:`loadtest.loadgen`) sending distinct texts (the corpus with a number in front), it measures:

- the **raw ceiling** of the same int8 graph, in-process with the service's session options: the texts
  tokenised (``encode_batch``, 256 a call) and run sorted by length in batches of 8 and of 32, whole
  passes, at the start and at the end of the run; the best batch size, the mean of the two passes;
- **this tree's service** (``python -m app``, which measures its batch cost model afresh: the model's files
  are linked into a folder of the run's own, where the model is cached) at 32 × 1 and 8 × 16 (against the ceiling), at 8 × 1 (p99 /
  p50, and sentences/s against today's), a background client alone (64 × 32 with ``Priority: u=7``), and
  that background client with an interactive 8 × 1 client beside it (its p99 against the idle 8 × 1 cell;
  the background's sentences/s against its own alone);
- **today's service** (``--today TREE``: another checkout, e.g. ``git archive`` of main, started from its
  own folder) at 8 × 1, in two rounds interleaved with this tree's, and with ``--today-all`` at 32 × 1 and
  8 × 16 too.

Sentences/s of a cell are counted by the server (its ``zhembed_queue_duration_seconds_count``: one per
input computed, by urgency) over the measured window: a 64 × 32 request takes about a minute on 2 CPU
cores, so counting answers that complete in a 20 s window would be noise. Latencies are the client's.
Prints one table with the issue's targets as PASS / MISS, and writes JSON to loadtest/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvloop

from loadtest import loadgen
from loadtest.corpus import load_corpus, unique_texts
from loadtest.raw_onnx import DEFAULT_MODEL, feed, open_encoder, service_output
from loadtest.scheduler_report import DISTURBED, Cell, engine_speed, print_model, print_summary, summarise
from loadtest.server import HOST, ServiceProcess, parse_exposition

RESULTS = Path(__file__).parent / "results"
QUEUED = "zhembed_queue_duration_seconds_count"


@dataclass
class Options:
    model: Path
    variant: str
    today: Path | None
    today_all: bool
    duration: float
    warmup: float
    raw_texts: int
    raw_seconds: float
    background: tuple[int, int]
    logs: Path
    cost_cache: Path


# --------------------------------------------------------------------------------------------- raw


def raw_ceiling(opts: Options, texts: list[str], batch_sizes: tuple[int, ...]) -> dict[int, float]:
    """Sentences/s of the bare session on ``texts`` at each batch size, tokenising included (see module)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(opts.model / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(512)
    session = open_encoder(opts.model, opts.variant)
    fetch = [service_output(session)]
    out: dict[int, float] = {}
    for size in batch_sizes:
        session.run(fetch, feed([np.array([101, 102])] * size))  # the first run of a session allocates
        elapsed, passes = 0.0, 0
        while passes == 0 or elapsed < opts.raw_seconds:
            started = time.perf_counter()
            ids = [
                np.asarray(e.ids, dtype=np.int64)
                for i in range(0, len(texts), 256)
                for e in tokenizer.encode_batch(texts[i : i + 256])
            ]
            ordered = sorted(ids, key=len)
            for i in range(0, len(ordered), size):
                session.run(fetch, feed(ordered[i : i + size]))
            elapsed += time.perf_counter() - started
            passes += 1
        out[size] = passes * len(texts) / elapsed
        print(f"  raw b={size}: {out[size]:.1f} sentences/s ({passes} pass(es))", flush=True)
    return out


# ------------------------------------------------------------------------------------------- cells


class Bodies:
    """Request bodies of distinct texts: each group of each cell draws from its own range of numbers."""

    def __init__(self, corpus: list[str]) -> None:
        self.corpus = corpus[:]
        random.Random(0).shuffle(self.corpus)
        self.next_range = 0

    def maker(self, texts: int) -> loadgen.BodyFactory:
        start = self.next_range
        self.next_range += 10_000_000

        def make(n: int) -> tuple[bytes, int]:
            batch = unique_texts(self.corpus, start + n * texts, texts)
            return orjson.dumps({"inputs": batch[0] if texts == 1 else batch}), texts

        return make


async def _scrape_async(port: int) -> dict[str, float]:
    status, text = await loadgen.get_json(HOST, port, "/metrics")
    return parse_exposition(text) if status == 200 and isinstance(text, str) else {}


def _queued_by_urgency(series: dict[str, float]) -> dict[str, float]:
    """Inputs computed so far, by urgency ("all" where the server has no urgency label: today's)."""
    out: dict[str, float] = {}
    for name, value in series.items():
        if name.startswith(QUEUED):
            label = name.partition('urgency="')[2].partition('"')[0] or "all"
            out[label] = out.get(label, 0.0) + value
    return out


def _stats(svc: ServiceProcess) -> dict[str, Any]:
    return svc.engine_stats()


def wait_idle(svc: ServiceProcess, timeout_s: float = 120.0) -> None:
    """Until the server has nothing in flight (what a previous cell left is cancelled or done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = _stats(svc)
        if stats.get("inputs_in_flight", 1) == 0 and stats.get("queue_depth", 1) == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server on port {svc.port} did not go idle in {timeout_s:.0f} s")


def run_cells(
    svc: ServiceProcess,
    groups: list[tuple[str, int, int, dict[str, str], str]],
    opts: Options,
    bodies: Bodies,
) -> list[Cell]:
    """One cell: every group's clients at once. A group: (name, clients, texts, headers, urgency label)."""
    wait_idle(svc)
    before_stats = _stats(svc)

    async def main() -> tuple[list[loadgen.CellResult], dict[str, float], dict[str, float]]:
        tasks = [
            asyncio.create_task(
                loadgen.run_cell(
                    HOST,
                    svc.port,
                    "/embed",
                    bodies.maker(texts),
                    clients,
                    opts.duration,
                    opts.warmup,
                    drain_s=2.0 if texts > 1 else 30.0,
                    headers=headers,
                )
            )
            for _, clients, texts, headers, _ in groups
        ]
        await asyncio.sleep(opts.warmup)
        first = _queued_by_urgency(await _scrape_async(svc.port))
        await asyncio.sleep(opts.duration)
        last = _queued_by_urgency(await _scrape_async(svc.port))
        return list(await asyncio.gather(*tasks)), first, last

    results, first, last = uvloop.run(main())
    after_stats = _stats(svc)
    moved = {
        k: after_stats[k] - before_stats.get(k, 0)
        for k in after_stats
        if isinstance(after_stats[k], int | float) and not isinstance(after_stats[k], bool)
    }
    cells = []
    for (name, clients, texts, _, label), result in zip(groups, results, strict=True):
        key = label if label in last else "all"
        cell = Cell(
            name,
            clients,
            texts,
            sentences_per_s=(last.get(key, 0.0) - first.get(key, 0.0)) / opts.duration,
            client_sentences_per_s=result.sentences_per_s,
            p50_ms=result.percentile(50),
            p99_ms=result.percentile(99),
            requests=result.requests,
            errors=result.errors,
            statuses=result.status_counts,
            engine=moved,
        )
        batches = moved.get("batches", 0)
        mean_batch = moved.get("batched_items", 0) / batches if batches else float("nan")
        print(
            f"  {name:<34} {cell.sentences_per_s:7.1f} sentences/s (client {cell.client_sentences_per_s:.1f})"
            f"  p50 {cell.p50_ms:7.0f} ms  p99 {cell.p99_ms:7.0f} ms  {cell.requests} answers, "
            f"{cell.errors} errors; mean batch {mean_batch:.1f}; engine {engine_speed(cell):.0f} tokens/s",
            flush=True,
        )
        cells.append(cell)
    return cells


def service_env(opts: Options, peak_inputs: int) -> dict[str, str]:
    return {
        "ZHEMBED_MODEL": str(opts.model),
        "ZHEMBED_VARIANT": opts.variant,
        "ZHEMBED_LOG_LEVEL": "warning",
        "ZHEMBED_CACHE_BYTES": "0",
        # Room for every client group at once: these cells measure scheduling, not refusals.
        "ZHEMBED_MAX_CONCURRENT_INPUTS": str(max(512, 2 * peak_inputs)),
        # Where the batch cost model goes if the model folder is read-only (the run links the model's files
        # into a folder of its own, so it is measured afresh in each run).
        "ZHEMBED_CACHE_DIR": str(opts.cost_cache),
    }


def linked(model: Path, into: Path) -> Path:
    """A folder of links to ``model``'s files: the service caches its batch cost model beside the export,
    here in the run's own folder, never in the model's (which may be shared, and read-only)."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in model.iterdir():
        if entry.is_file():
            (into / entry.name).symlink_to(entry.resolve())
    return into


@contextlib.contextmanager
def servers(opts: Options, peak_inputs: int) -> Iterator[tuple[ServiceProcess, ServiceProcess | None]]:
    env = service_env(opts, peak_inputs)
    ours = ServiceProcess("app", env, opts.logs / "scheduler-ours.log", cwd=Path(__file__).parents[1])
    today = None
    if opts.today is not None:
        today_env = {**env, "PYTHONPATH": str(opts.today)}
        today = ServiceProcess("app", today_env, opts.logs / "scheduler-today.log", cwd=opts.today)
    with ours:  # started one after the other: the cost model is measured on a quiet machine
        if today is None:
            yield ours, None
        else:
            with today:
                yield ours, today


# -------------------------------------------------------------------------------------------- main


def run(opts: Options) -> dict[str, Any]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread, as the service tokenises
    corpus = load_corpus()
    shuffled = corpus[:]
    random.Random(7).shuffle(shuffled)
    raw_texts = unique_texts(shuffled, 90_000_000, opts.raw_texts)
    print(
        f"raw ceiling, {opts.variant}, {len(raw_texts)} distinct texts, tokenising included (start)",
        flush=True,
    )
    raw_start = raw_ceiling(opts, raw_texts, (8, 32))
    bodies = Bodies(corpus)
    bg_clients, bg_texts = opts.background
    out: dict[str, Any] = {"raw_start": raw_start, "cells": {}}
    cells: dict[str, Cell] = {}
    with servers(opts, bg_clients * bg_texts + 64) as (ours, today):
        status, info = asyncio.run(loadgen.get_json(HOST, ours.port, "/info"))
        out["cost_model"] = info["batching"] if status == 200 and isinstance(info, dict) else None
        if out["cost_model"] is not None:
            print_model("cost model at start", out["cost_model"])

        def one(svc: ServiceProcess, key: str, clients: int, texts: int) -> None:
            (cells[key],) = run_cells(svc, [(key, clients, texts, {}, "3")], opts, bodies)

        print("cells", flush=True)
        one(ours, "ours 8x1 (1)", 8, 1)
        if today is not None:
            one(today, "today 8x1 (1)", 8, 1)
        one(ours, "ours 32x1", 32, 1)
        one(ours, "ours 8x16", 8, 16)
        if today is not None and opts.today_all:
            one(today, "today 32x1", 32, 1)
            one(today, "today 8x16", 8, 16)
        background = ("background", bg_clients, bg_texts, {"Priority": "u=7"}, "7")
        (cells["background alone"],) = run_cells(ours, [background], opts, bodies)
        mixed = run_cells(ours, [background, ("interactive", 8, 1, {}, "3")], opts, bodies)
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
    out["cells"] = {k: vars(c) for k, c in cells.items()}
    out["summary"] = summarise(cells, raw_start, raw_end, today is not None)
    speeds = {k: engine_speed(c) for k, c in cells.items()}
    median = float(np.nanmedian(list(speeds.values())))
    out["disturbed"] = [k for k, v in speeds.items() if v < DISTURBED * median]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.scheduler", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--today", type=Path, default=None, help="another checkout to measure as today's")
    parser.add_argument("--today-all", action="store_true", help="today's 32x1 and 8x16 too")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each cell counts")
    parser.add_argument("--raw-texts", type=int, default=320, help="texts of each raw pass")
    parser.add_argument("--raw-seconds", type=float, default=5.0, help="least seconds of raw passes per size")
    parser.add_argument("--background", default="64x32", help="clients x texts of the background client")
    parser.add_argument("--quick", action="store_true", help="a tiny model and short cells (a CI test)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    bg_clients, bg_texts = (int(x) for x in args.background.split("x"))
    with tempfile.TemporaryDirectory(prefix="zhembed-sched-") as tmp:
        opts = Options(
            model=args.model,
            variant=args.variant,
            today=args.today,
            today_all=args.today_all,
            duration=args.duration,
            warmup=args.warmup,
            raw_texts=args.raw_texts,
            raw_seconds=args.raw_seconds,
            background=(bg_clients, bg_texts),
            logs=RESULTS / "logs",
            cost_cache=Path(tmp) / "cache",
        )
        if not args.quick:  # measured afresh in every run, and written only under the run's own folder
            opts = Options(**{**vars(opts), "model": linked(args.model, Path(tmp) / "model")})
        if args.quick:
            from loadtest.quick_model import quick_model

            with quick_model(("int8",)) as (model, _):
                quick = {"model": model, "duration": 1.5, "warmup": 0.5, "raw_texts": 64, "raw_seconds": 0.2}
                result = run(Options(**{**vars(opts), **quick, "background": (8, 4)}))
        else:
            result = run(opts)
    print_summary(result["summary"])
    if result["disturbed"]:
        print(
            f"\nDISTURBED (the engine ran under {DISTURBED:.0%} of the run's median tokens/s: other work on the "
            f"cores): {', '.join(result['disturbed'])}"
        )
    out = args.out or RESULTS / f"scheduler-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
