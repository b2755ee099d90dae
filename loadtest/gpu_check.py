"""The GPU table of ``POST /embed``: the service in fp16 against the raw fp16 ceiling, and issue 52's targets.

    bash loadtest/gpu_check.sh [ARGS]     on the GPU host, after ``source .gpu/kN/env.sh``: the whole device run
    python -m loadtest.gpu_check --model models/bert-base-chinese-twin [--seconds 8] [--warmup 3]
    python -m loadtest.gpu_check --model DIR --provider CPUExecutionProvider    (the same steps on a CPU)

Prints fp16/fp32 parity, the raw fp16 rows (batch × sequence, sentences/s, TFLOP/s), then a row per
cell (wrk, sent/s, req/s, p50/p99, err, batch, busy, srv cpu, cli cpu): on ``--main-workers`` CLIENTS × 32,
the same in base64, CLIENTS × 1 and 1 × 1; on each other count of ``--workers`` (1, 2, 4, 8) the
``--worker-cells``; then each cell's figures by worker count, the targets as PASS / MISS (with the float
cell against the base64 one, ≥ 0.85, and every main cell's p99 ≤ 3 × its p50) and JSON in
loadtest/results/gpu-check-<time>.json (``--markdown``: the tables as markdown, :mod:`loadtest.gpu_report`;
``--attach``: other stages' JSON in the report). ``--setting NAME=VALUE`` sets a service setting for every
start; ``--budget-s`` leaves out the worker counts that would run past it. Exits 1 when a service did not
start or a cell failed. docs/performance-log.md says what each column means.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.serving.cluster import AUTO_CUDA_WORKERS
from app.settings import Settings
from loadtest import gpu_report, raw_onnx
from loadtest.corpus import load_corpus
from loadtest.harness import TWIN, parser
from loadtest.harness.cell import STRIDE, Cell, distinct_bodies
from loadtest.harness.measure import WORKERS_READY, measure
from loadtest.harness.report import RESULTS, Column, Goal, Row, Table, write_json
from loadtest.harness.service import GPU_LIKE, PREFIX, service_env
from loadtest.server import DidNotStart, ServiceProcess

CUDA = "CUDAExecutionProvider"
# (sequence, batches) of the raw grid; CEILING is the (batch, sequence) the targets are ratios to.
RAW_GRID = ((32, (32, 128, 256)), (128, (256,)))
CEILING = (256, 32)
# A client at this many cores or more may be what limits its cell.
CLIENT_BOUND_CORES = 0.9
WRK, BUSY = Column("wrk", 3, "d", "workers"), Column("busy", 5, ".2f", "busy")
TABLE = Table(
    "cell", 16, WRK, "sent/s", "req/s", "p50 ms", "p99 ms", "err", "batch", BUSY, "srv cpu", "cli cpu"
)


def format_cell(c: Row) -> str:
    wrong = "" if c.workers_ready == c.workers else f"{WORKERS_READY} {c.workers_ready:g}"
    return TABLE.row(c, c.notes(wrong))


def targets(main: dict[str, Row], clients: int, ceiling: float) -> list[str]:
    """Issue 52's GPU targets, each with its measured value; ``main`` holds the main cells by label (a
    missing one, from a service that did not start, makes its targets n/a)."""
    many, single, share = f"{clients}x32", f"{clients}x1", "{:.2f} ({raw:,.0f} / {per:,.0f})"
    base64 = main.get(f"{many} base64")
    b64_rate = base64.sentences_per_s if base64 is not None else None
    goals = [
        Goal(f"{many} >= 20,000 sentences/s", many, "sentences_per_s", ">=", 20_000, "{:,.0f}"),
        Goal(f"{many} >= 0.5 x raw ceiling", many, "sentences_per_s", ">=", 0.5, share, ceiling),
        Goal(f"{many} float >= 0.85 x base64", many, "sentences_per_s", ">=", 0.85, share, b64_rate),
        Goal(f"{single} >= 5,000 requests/s", single, "requests_per_s", ">=", 5000, "{:,.0f}"),
        Goal("1x1 p50 <= 2 ms", "1x1", "p50_ms", "<=", 2, "{:.2f} ms"),
        Goal("1x1 p99 <= 5 ms", "1x1", "p99_ms", "<=", 5, "{:.2f} ms"),
    ]
    goals += [Goal(f"{label} p99 <= 3 x p50", label, _tail, "<=", 3, "{:.2f}") for label in main]
    out = []
    for goal in goals:
        cores = (main[goal.row].client_cores or 0) if goal.row in main else 0
        limit = f" (client at {cores:.2f} cores: it may be the limit)" if cores >= CLIENT_BOUND_CORES else ""
        out.append(goal.line(main) + limit)
    return out


def _tail(row: Row) -> float | None:
    """p99 over p50 (None where either is not known)."""
    return row.p99_ms / row.p50_ms if row.p99_ms and row.p50_ms else None


def parity(model: Path, provider: str) -> float:
    """The least pooled cosine between fp16 on ``provider`` and fp32 on the CPU, on the same inputs."""
    feed, fetch = raw_onnx.synthetic_feed(16, 48), [raw_onnx.LAST_HIDDEN_STATE]
    a = raw_onnx.open_encoder(model, "fp16", provider=provider).run(fetch, feed)[0].mean(1)
    b = raw_onnx.open_encoder(model, "fp32").run(fetch, feed)[0].mean(1)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


# Rows of each batching (docs/api.md "The same vector for the same text"): 0 is the text under test, 1-3 its
# company (long, middle, one token); the last fills a batch of 64, where a GPU's kernels may tile otherwise.
BATCHINGS = ([0], [0, 1], [1, 0], [0] * 8, [2, 0, 3, 1], [1] * 5 + [0] + [3] * 10, [1] * 63 + [0])
LENGTHS = (14, 120, 40, 3)


def batchings(model: Path, provider: str) -> dict[str, Any]:
    """The fp16 encoder on ``provider``: one text's answers in each of ``BATCHINGS`` against its answer
    alone. ``pooled_max_abs`` is the largest component difference of the normalised served vector (the
    graph's pooled mean), ``states_identical`` whether its own tokens' states were the same bytes, and
    ``states_max_rel`` their largest difference over the largest state."""
    rng = np.random.default_rng(1)
    ids = [np.array([101, *rng.integers(1000, 20000, n - 2), 102], dtype=np.int64) for n in LENGTHS]
    session = raw_onnx.open_encoder(model, "fp16", provider=provider)
    pooled_name, last = raw_onnx.service_output(session), raw_onnx.LAST_HIDDEN_STATE
    names = list(dict.fromkeys([pooled_name, last]))

    def answer(rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        got = session.run(names, raw_onnx.feed([ids[r] for r in rows]))
        out = dict(zip(names, got, strict=True))
        i, n = rows.index(0), LENGTHS[0]
        states = out[last][i, :n].astype(np.float32)
        vec = out[pooled_name][i].astype(np.float32) if pooled_name != last else states.mean(0)
        return vec / np.linalg.norm(vec), states

    alone_vec, alone_states = answer(BATCHINGS[0])
    pooled, rel, same = 0.0, 0.0, True
    for rows in BATCHINGS[1:]:
        vec, states = answer(list(rows))
        pooled = max(pooled, float(np.abs(vec - alone_vec).max()))
        rel = max(rel, float(np.abs(states - alone_states).max() / np.abs(alone_states).max()))
        same = same and states.tobytes() == alone_states.tobytes()
    return {"pooled_max_abs": pooled, "states_identical": same, "states_max_rel": rel}


def raw(model: Path, peak: float, seconds: float, provider: str) -> dict[tuple[int, int], float]:
    """Sentences/s of the fp16 encoder at each (batch, sequence) of ``RAW_GRID``, printed as a table."""
    fetch = raw_onnx.service_output(raw_onnx.open_encoder(model, "fp16", provider=provider))
    print(f"raw fp16 encoder on {provider}, numpy feeds, fetching {fetch}, {seconds:g} s a row")
    print(f"{'seq':>5}{'batch':>7}{'sentences/s':>13}{'TFLOP/s':>10}{'% peak':>8}")
    rates: dict[tuple[int, int], float] = {}
    for seq, batches in RAW_GRID:
        for batch in batches:
            ids = list(raw_onnx.synthetic_feed(batch, seq)["input_ids"])
            got = raw_onnx.ceiling(model, "fp16", ids, batch, seconds, provider=provider)
            rates[batch, seq], tflops = got.sentences_per_s, got.useful_flops_per_s / 1e12
            line = f"{seq:>5}{batch:>7}{got.sentences_per_s:>13.0f}{tflops:>10.2f}{100 * tflops / peak:>8.2f}"
            print(line, flush=True)
    return rates


def settings_env(args: argparse.Namespace, workers: int | None = None) -> dict[str, str]:
    """The service's settings: fp16 on the provider, cache off, GPU-like batches, and one admission budget
    across workers (app.serving.cluster) of twice the most inputs any cell has in flight; then each
    ``--setting NAME=VALUE`` (the shape grid and CUDA graphs of issue 52 items 2-3 are toggled this way)."""
    more: dict[str, Any] = {"providers": args.provider, "shutdown_drain_s": 0}  # each stop would wait 2 s
    more.update(GPU_LIKE)
    more.update(args.settings)
    return service_env(args.model, "fp16", 2 * args.clients * 32, workers=workers, **more)


def parse_setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` → (name, value); the name is checked against the service's settings when used."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--setting takes NAME=VALUE, not {text!r}")
    return name.strip().lower(), value


def worker_cells(args: argparse.Namespace, workers: int) -> list[Cell]:
    """The cells one worker count runs: the main count all four, the others ``--worker-cells``."""
    specs = {
        "x32": Cell(args.clients, 32),
        "base64": Cell(args.clients, 32, "base64"),
        "x1": Cell(args.clients, 1),
        "1x1": Cell(1, 1),
    }
    names = list(specs) if workers == args.main_workers else args.worker_cells
    return [specs[n] for n in names]


def grid_line(grid: dict[str, Any] | None) -> str:
    """What /info's ``batching.shape_grid`` says of the grid a service warmed before /ready."""
    if not grid:
        return "exact shapes (no grid)"
    graphs = f", {grid.get('cuda_graphs_captured')} CUDA graphs" if grid.get("cuda_graphs") else ""
    return (
        f"{grid.get('warmed_shapes')} of {grid.get('shapes')} grid shapes warmed in {grid.get('warmup_s')} s"
        f"{graphs}; IOBinding {grid.get('io_binding')}, read back by {grid.get('readback')}"
    )


def service_cells(args: argparse.Namespace) -> tuple[list[Row], list[int], list[int], dict[int, Any]]:
    """Every service cell, one service start per worker count, the main count first; the counts whose
    service did not start (its log's end is printed, and the run goes on to the next count); the counts
    left out because the last count's time would take the run past ``--budget-s``; and each count's
    shape grid as /info shows it once ready (None: exact shapes)."""
    corpus = load_corpus()
    grids: dict[int, Any] = {}
    cells: list[Row] = []
    not_started: list[int] = []
    skipped: list[int] = []
    started, last = time.perf_counter(), 0.0
    for workers in dict.fromkeys([args.main_workers, *args.workers]):
        t0 = time.perf_counter()
        if cells and over_budget(t0 - args.began, last, args.budget_s):
            print(
                f"-- ZHEMBED_WORKERS={workers}: skipped, over the budget of {args.budget_s:g} s", flush=True
            )
            skipped.append(workers)
            continue
        log = RESULTS / "logs" / f"gpu-service-w{workers}.log"
        try:
            with ServiceProcess("app", settings_env(args, workers), log) as svc:
                ready = time.perf_counter() - t0
                grids[workers] = svc.info().get("batching", {}).get("shape_grid")
                print(
                    f"-- ZHEMBED_WORKERS={workers}, ready in {ready:.1f} s; {grid_line(grids[workers])}",
                    flush=True,
                )
                for spec in worker_cells(args, workers):
                    bodies = distinct_bodies(corpus, spec.texts, len(cells) * STRIDE, spec.encoding)
                    m = measure(svc, spec, bodies, args.seconds, args.warmup)
                    cells.append(Row.of(m, workers=workers))
                    print(format_cell(cells[-1]), flush=True)
        except DidNotStart as exc:
            print(f"-- ZHEMBED_WORKERS={workers}: did not start: {exc}", flush=True)
            not_started.append(workers)
        if workers != args.main_workers:  # the main count runs more cells than the others
            last = time.perf_counter() - t0
    print(f"service cells: {time.perf_counter() - started:.0f} s")
    return cells, not_started, skipped, grids


def over_budget(elapsed: float, last: float, budget: float) -> bool:
    """Whether a worker count that takes as long as the last one (``last`` seconds) would end past
    ``budget`` seconds from the start (0: no budget)."""
    return budget > 0 and elapsed + last > budget


def by_workers(cells: list[Row]) -> list[str]:
    """One line per cell label: its sentences/s (requests/s for x1 cells), p50 and p99 at each count."""
    out = []
    for label in dict.fromkeys(c.label for c in cells):
        rows = sorted((c for c in cells if c.label == label), key=lambda c: c.workers)
        figures = [
            f"{c.workers}: {c.sentences_per_s:,.0f}/s p50 {c.p50_ms or 0:.1f} p99 {c.p99_ms or 0:.1f} ms"
            for c in rows
        ]
        out.append(f"{label} by workers: {'; '.join(figures)}")
    return out


def run(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """The whole check; the JSON report, and True when every service started and every cell answered
    without errors on the number of workers asked for."""
    started = args.began = time.perf_counter()
    shape = raw_onnx.shape_of(args.model)
    print(
        f"zhembed gpu_check: {args.model} ({shape.layers} layers, hidden {shape.hidden}); "
        f"onnxruntime {ort.__version__}, {args.provider}"
    )
    cosine = parity(args.model, args.provider)
    print(f"fp16 on {args.provider} vs fp32 on CPU, pooled cosine min: {cosine:.6f}")
    batched = batchings(args.model, args.provider)
    same, rel = batched["states_identical"], batched["states_max_rel"]
    print(
        f"fp16 on {args.provider}, one text in {len(BATCHINGS) - 1} batchings against alone: normalised vector "
        f"max |diff| {batched['pooled_max_abs']:.2e}; its token states "
        + ("identical bytes" if same else f"max diff {rel:.2e} of the largest")
    )
    rates = raw(args.model, args.peak_tflops, args.raw_seconds, args.provider)
    top = rates[CEILING]
    env = {k: v for k, v in settings_env(args).items() if k != f"{PREFIX}MODEL"}
    window = f"cells {args.seconds:g} s (+{args.warmup:g} s warm-up)"
    print(
        f"service: python -m app, {' '.join(f'{k}={v}' for k, v in env.items())}; distinct corpus texts; {window}"
    )
    print(TABLE.header, flush=True)
    cells, not_started, skipped, grids = service_cells(args)
    on_main = {c.label: c for c in cells if c.workers == args.main_workers}
    print(*by_workers(cells), sep="\n")
    print(f"raw ceiling (batch {CEILING[0]}, sequence {CEILING[1]}): {top:,.0f} sentences/s")
    verdicts = targets(on_main, args.clients, top)
    target_note = "" if args.provider == CUDA else f"; on {args.provider} they mean nothing"
    print(f"Targets (issue 52, GPU{target_note}):", *verdicts, sep="\n")
    total = time.perf_counter() - started
    print(f"total: {total:.0f} s")
    report = {
        "model": str(args.model),
        "provider": args.provider,
        "onnxruntime": ort.__version__,
        "parity_cosine_min": cosine,
        "batchings": batched,
        "raw": [{"batch": b, "seq": s, "sentences_per_s": r} for (b, s), r in rates.items()],
        "raw_ceiling": {"batch": CEILING[0], "seq": CEILING[1], "sentences_per_s": top},
        "service_env": env,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "main_workers": args.main_workers,
        "cells": [c.as_json() for c in cells],
        "not_started": not_started,
        "over_budget": skipped,
        "shape_grid": {str(w): grid for w, grid in grids.items()},
        "targets": verdicts,
        "total_s": total,
        **gpu_report.attached(args.attach),
    }
    write_json(report, args.out, "gpu-check")
    if args.markdown:
        args.markdown.write_text(gpu_report.markdown(report))
        print(f"markdown: {args.markdown}")
    bad = [f"{c.label} ({c.workers} workers)" for c in cells if c.failed]
    bad += [f"the service with {w} workers did not start" for w in not_started]
    if bad:
        print(f"failed: {'; '.join(bad)}", file=sys.stderr)
    return report, not bad


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # 8 s windows after 3 s of warm-up, and over 3x a p50 of 2 s (harness.report: shorter windows make the
    # rate noise); 13 cells on 4 service starts come to about 3.5 minutes on the GPU.
    p = parser("loadtest.gpu_check", __doc__, model=TWIN, seconds=8.0, warmup=3.0, out=None)
    p.add_argument("--provider", default=CUDA, help="execution provider (default: %(default)s)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense fp16 peak")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="least seconds of each raw row")
    # The CPU run wants fewer: with 256 a request outlasts a short window on 2 busy cores (bench.py).
    p.add_argument("--clients", type=int, default=256, help="concurrent clients of the many-client cells")
    main = f"ZHEMBED_WORKERS of the main cells (default: {AUTO_CUDA_WORKERS} on CUDA, 1 otherwise)"
    p.add_argument("--main-workers", type=int, help=main)
    p.add_argument("--workers", default="1,2,4,8", help="the other worker counts (%(default)s)")
    cells = "cells at the other counts, of x32 (CLIENTSx32), base64, x1 (CLIENTSx1), 1x1 (%(default)s)"
    p.add_argument("--worker-cells", default="x32,x1,1x1", help=cells)
    p.add_argument("--setting", dest="settings", type=parse_setting, action="append", default=[],
                   metavar="NAME=VALUE", help="a service setting for every start (ZHEMBED_NAME), repeatable")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=0.0, help="leave out worker counts past this (0: none)")
    p.add_argument(
        "--attach", action="append", default=[], metavar="NAME=JSON", help="a stage's JSON to include"
    )
    p.add_argument("--markdown", type=Path, help="write the report's tables here too")
    args = p.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.worker_cells = [c for c in args.worker_cells.split(",") if c]
    unknown = set(args.worker_cells) - {"x32", "base64", "x1", "1x1"}
    if unknown:
        p.error(f"--worker-cells: not cells: {sorted(unknown)}")
    args.settings = dict(args.settings)
    unknown = set(args.settings) - set(Settings.model_fields)
    if unknown:  # refused before any stage runs, not at the first service start
        p.error(f"--setting: not settings of this service: {sorted(unknown)}")
    if args.main_workers is None:
        args.main_workers = AUTO_CUDA_WORKERS if args.provider == CUDA else 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.provider not in ort.get_available_providers():
        raise SystemExit(
            f"no {args.provider} here ({ort.get_available_providers()}): install onnxruntime-gpu"
        )
    _, ok = run(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
