"""The raw ONNX Runtime ceiling, the service over HTTP, a naive PyTorch service and the cache in one table.

    python -m loadtest.bench [--model DIR] [--variants fp32,int8] [--duration 10] \
        [--concurrency 1,8,32,128] [--texts 1,16] [--skip-naive] [--quick]

Rows ``raw`` (per variant, best batch size and batch 1), ``service c=C xT``, ``naive c=C xT`` (up to
``--naive-max-concurrency``) and ``cache 100% / 0% hit``; columns sent/s, req/s, p50/p90/p99 ms, err,
GFLOP/s, %peak, svc/raw, svc/nv, client and server cores. Then issue 5's targets as PASS / MISS, and
JSON in loadtest/results/bench-<time>.json. docs/performance.md has the details and the runs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from app.settings import Settings
from loadtest import loadgen, sparse_cost
from loadtest.corpus import HIT_SET, load_corpus, request_bodies, token_ids
from loadtest.flops import BertShape, gemm_peak
from loadtest.harness.cell import Cell, distinct_bodies
from loadtest.harness.measure import measure
from loadtest.harness.report import RESULTS, Row, write_json
from loadtest.harness.service import service_env
from loadtest.quick_model import quick_model
from loadtest.raw_onnx import CeilingResult, ceiling, open_encoder, shape_of, variants_in
from loadtest.server import HOST, ServiceProcess
from loadtest.table import HEADER, format_row, link_naive, summary

# The service's batch size (its default max_batch_size): the sparse head's cost is timed at it.
SERVICE_BATCH = int(Settings.model_fields["max_batch_size"].default)

# --------------------------------------------------------------------------------------------- raw


def raw_rows(
    opts: argparse.Namespace, ids: list[np.ndarray], shape: BertShape, peaks: dict[str, float]
) -> tuple[list[Row], dict[str, CeilingResult]]:
    rows: list[Row] = []
    best: dict[str, CeilingResult] = {}
    for variant in opts.variants:
        session = open_encoder(opts.model, variant)
        results = [ceiling(session, variant, ids, b, shape, opts.raw_seconds) for b in opts.batch_sizes]
        top = max(results, key=lambda r: r.sentences_per_s)
        best[variant] = top
        single = next((r for r in results if r.batch_size == 1), None)
        tried = ", ".join(f"b{r.batch_size}={r.sentences_per_s:.1f}" for r in results)
        shown = [(top, f"raw {variant} best b={top.batch_size}")]
        if single is not None and single is not top:
            shown.append((single, f"raw {variant} b=1"))
        for r, label in shown:
            rows.append(
                Row(
                    kind="raw",
                    label=label,
                    sentences_per_s=r.sentences_per_s,
                    requests_per_s=r.batches_per_s,
                    p50_ms=float(np.percentile(r.batch_ms, 50)),
                    p90_ms=float(np.percentile(r.batch_ms, 90)),
                    p99_ms=float(np.percentile(r.batch_ms, 99)),
                    errors=0,
                    useful_gflops=r.useful_flops_per_s / 1e9,
                    peak_share=r.useful_flops_per_s / peaks[variant],
                    note=f"padding {r.padding_share:.1%}; tried {tried}"
                    if r is top
                    else "latency = per sentence",
                    extra={
                        "variant": variant,
                        "batch_size": r.batch_size,
                        "computed_gflops": r.computed_flops_per_s / 1e9,
                        "passes": r.passes,
                    },
                )
            )
        del session
    return rows, best


# -------------------------------------------------------------------------------------------- http


def _row(
    kind: str,
    label: str,
    svc: ServiceProcess,
    make: loadgen.BodyFactory,
    c: Cell,
    opts: argparse.Namespace,
    note: str = "",
) -> Row:
    """One load cell's row; the server's CPU cores are over the whole cell."""
    m = measure(svc, c, make, opts.duration, opts.warmup, metrics=False)
    row = Row.of(m, kind, note=note)
    row.label = label
    return row


def _padding(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    real = after.get("real_tokens", 0) - before.get("real_tokens", 0)
    padded = after.get("padded_tokens", 0) - before.get("padded_tokens", 0)
    return 1 - real / padded if padded else None


def _service_env(opts: argparse.Namespace, cache_bytes: int) -> dict[str, str]:
    peak_inputs = max(opts.concurrency) * max(opts.texts)
    return service_env(opts.model, opts.service_variant, peak_inputs, cache_bytes=cache_bytes)


def service_rows(
    opts: argparse.Namespace,
    corpus: list[str],
    ids: list[np.ndarray],
    shape: BertShape,
    raw_best: CeilingResult | None,
    bracket: Callable[[], float] | None,
) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    facts: dict[str, Any] = {}
    flops_per_sentence = float(np.mean([shape.flops(len(x)) for x in ids]))
    with ServiceProcess("app", _service_env(opts, 0), opts.logs / "service.log") as svc:
        facts["memory_after_start"] = svc.processes().as_json()
        for route, per_request, c in (
            (r, t, c) for t in opts.texts for c in opts.concurrency for r in opts.routes
        ):
            make = loadgen.cycle(request_bodies(corpus, per_request), per_request)
            before_raw = bracket() if bracket and c == 32 and per_request == 1 else None
            before = svc.engine_stats()
            label = f"service c={c} x{per_request}" + ("" if route == "/embed" else f" {route}")
            row = _row("service", label, svc, make, Cell(c, per_request, route=route), opts)
            after = svc.engine_stats()
            after_raw = bracket() if bracket and before_raw is not None else None
            padding = _padding(before, after)
            batches = after.get("batches", 0) - before.get("batches", 0)
            items = after.get("batched_items", 0) - before.get("batched_items", 0)
            note = f"padding {padding:.1%}" if padding is not None else ""
            if batches:
                note += f"; mean batch {items / batches:.1f}"
            row.note = "; ".join(x for x in (note, row.note) if x)
            rate = row.sentences_per_s or 0.0
            row.useful_gflops = rate * flops_per_sentence / 1e9
            row.extra.update(padding_share=padding, engine_before=before, engine_after=after)
            if raw_best is not None:
                row.vs_raw = rate / raw_best.sentences_per_s
                if after_raw is not None and before_raw is not None:
                    adjacent = (before_raw + after_raw) / 2
                    row.vs_raw = rate / adjacent
                    row.extra["raw_adjacent_sentences_per_s"] = [before_raw, after_raw]
                    row.note += f"; vs raw pass adjacent ({before_raw:.1f}/{after_raw:.1f} s/s)"
            rows.append(row)
            print(format_row(row), flush=True)
        facts["memory_steady"] = svc.processes().as_json()
    return rows, facts


def naive_rows(opts: argparse.Namespace, corpus: list[str]) -> list[Row]:
    if opts.naive_source is None:
        return []
    env = {"NAIVE_MODEL": str(opts.naive_source), "NAIVE_TWIN": "1" if opts.naive_twin else "0"}
    rows: list[Row] = []
    with ServiceProcess("loadtest.baselines.naive_service", env, opts.logs / "naive.log") as svc:
        for body in request_bodies(
            corpus[:8], 1
        ):  # PyTorch's first calls pay one-off set-up; not the baseline's cost
            uvloop.run(loadgen.post(HOST, svc.port, "/embed", body))
        for per_request in opts.texts:
            make = loadgen.cycle(request_bodies(corpus, per_request), per_request)
            for c in (c for c in opts.concurrency if c <= opts.naive_max_concurrency):
                row = _row("naive", f"naive c={c} x{per_request}", svc, make, Cell(c, per_request), opts)
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


def _cache_counts(svc: ServiceProcess) -> dict[str, float] | None:
    """Memory-tier hits and misses from /metrics; None when the service has no cache."""
    series = svc.metrics()
    if series is None or not any(name.startswith("zhembed_cache_hits") for name in series):
        return None
    return {
        "hits": series.get('zhembed_cache_hits_total{tier="memory"}', 0.0),
        "misses": series.get('zhembed_cache_misses_total{tier="memory"}', 0.0),
    }


def cache_rows(opts: argparse.Namespace, corpus: list[str]) -> tuple[list[Row], dict[str, Any]]:
    labels = ("cache 100% hit c=32 x1", "cache 0% hit c=32 x1")
    c = 32 if 32 in opts.concurrency else max(opts.concurrency)
    labels = tuple(label.replace("c=32", f"c={c}") for label in labels)  # type: ignore[assignment]
    facts: dict[str, Any] = {"cache_bytes": opts.cache_bytes}
    with ServiceProcess("app", _service_env(opts, opts.cache_bytes), opts.logs / "service-cache.log") as svc:
        if _cache_counts(svc) is None:
            why = "n/a (no cache): /metrics has no zhembed_cache_* counters"
            return [Row(label, "cache", note=why) for label in labels], facts
        hot = request_bodies(corpus[:HIT_SET], 1)
        for body in hot:  # fill the cache with the hit set
            uvloop.run(loadgen.post(HOST, svc.port, "/embed", body))
        shuffled = corpus[:]
        random.Random(1).shuffle(shuffled)
        unique = distinct_bodies(shuffled, 1, 0)
        rows: list[Row] = []
        for label, make in ((labels[0], loadgen.cycle(hot, 1)), (labels[1], unique)):
            before = _cache_counts(svc) or {}
            row = _row("cache", label, svc, make, Cell(c, 1), opts)
            after = _cache_counts(svc) or {}
            hits = after.get("hits", 0) - before.get("hits", 0)
            misses = after.get("misses", 0) - before.get("misses", 0)
            ratio = hits / (hits + misses) if hits + misses else float("nan")
            row.note = "; ".join(x for x in (f"measured hit ratio {ratio:.1%}", row.note) if x)
            rows.append(row)
            print(format_row(row), flush=True)
        facts["memory_steady"] = svc.processes().as_json()
    return rows, facts


# -------------------------------------------------------------------------------------------- main


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", type=Path, default=Path("models/bert-base-chinese-twin"))
    p.add_argument("--variants", default=None, help="raw-ceiling variants; default fp32,int8 where present")
    p.add_argument("--service-variant", default="int8", help="ZHEMBED_VARIANT of the service rows")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per HTTP cell")
    p.add_argument("--warmup", type=float, default=None, help="unmeasured seconds before each cell")
    p.add_argument("--concurrency", type=ints, default="1,8,32,128")
    p.add_argument("--texts", type=ints, default="1,16", help="texts per request")
    p.add_argument(
        "--routes",
        type=lambda v: v.split(","),
        default=["/embed"],
        help="routes of the service rows, each cell on each in turn (e.g. /embed,/embed_sparse)",
    )
    p.add_argument("--batch-sizes", type=ints, default="1,4,8,16", help="raw-ceiling batch sizes to try")
    p.add_argument("--raw-seconds", type=float, default=3.0, help="least time per raw batch size")
    p.add_argument("--naive-max-concurrency", type=int, default=32)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--cache-bytes", type=int, default=64 * 2**20, help="cache budget of the cache rows")
    p.add_argument("--quick", action="store_true", help="tiny model in a temp dir, a few seconds in all")
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path; default loadtest/results/bench-<time>.json"
    )
    return p.parse_args(argv)


def run(args: argparse.Namespace, model: Path, naive_source: Path | None, naive_twin: bool) -> dict[str, Any]:
    present = variants_in(model)
    wanted = args.variants.split(",") if args.variants else [v for v in ("fp32", "int8") if v in present]
    opts = args
    opts.model, opts.naive_source, opts.naive_twin, opts.logs = (
        model,
        naive_source,
        naive_twin,
        RESULTS / "logs",
    )
    opts.variants = [v for v in wanted if v in present and v != "fp16"]  # fp16 only pays on CUDA
    opts.warmup = args.warmup if args.warmup is not None else min(2.0, args.duration / 4)
    corpus = load_corpus()
    ids = token_ids(model, corpus)
    shape = shape_of(model)
    manifest = json.loads((model / "manifest.json").read_text())
    files = [g[opts.service_variant] for g in manifest["graphs"].values() if opts.service_variant in g]
    started = time.time()
    print(
        f"zhembed bench: {model} ({len(corpus)} sentences, mean {np.mean([len(x) for x in ids]):.1f} tokens)"
    )
    print(HEADER, flush=True)
    peaks = {"fp32": gemm_peak("fp32"), "int8": gemm_peak("int8")}
    raw, best = raw_rows(opts, ids, shape, peaks)
    facts: dict[str, Any] = {}
    for r in raw:
        print(format_row(r), flush=True)
    if "/embed_sparse" in opts.routes:  # where the sparse route's time goes, beside its service rows
        cost = sparse_cost.measure(model, opts.service_variant, ids, SERVICE_BATCH, opts.raw_seconds)
        facts["sparse_cost"] = (
            None if cost is None else {**asdict(cost), "share": cost.share, "line": cost.line()}
        )
        print(cost.line() if cost else f"{model} has no {opts.service_variant} sparse graph", flush=True)
    raw_best = best.get(opts.service_variant)
    bracket: Callable[[], float] | None = None
    if raw_best is not None:
        session = open_encoder(model, opts.service_variant)
        size = raw_best.batch_size

        def bracket() -> float:
            return ceiling(session, opts.service_variant, ids, size, shape, 0.0).sentences_per_s

    svc, service_facts = service_rows(opts, corpus, ids, shape, raw_best, bracket)
    facts.update(service_facts)
    bracket = None
    naive = [] if opts.skip_naive else naive_rows(opts, corpus)
    cache, cache_facts = cache_rows(opts, corpus)
    rows = raw + svc + naive + cache
    link_naive(rows, peaks, opts.service_variant, float(np.mean([shape.flops(len(x)) for x in ids])))
    facts.update(
        model_bytes=sum(f["bytes"] for f in files),
        cache_budget=0,
        cache=cache_facts,
        gemm_peak_gflops={k: v / 1e9 for k, v in peaks.items()},
    )
    seconds = time.time() - started
    report = {
        "model": str(model),
        "service_variant": opts.service_variant,
        "corpus_sentences": len(corpus),
        "corpus_mean_tokens": float(np.mean([len(x) for x in ids])),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "seconds": seconds,
        "facts": facts,
        "rows": [r.as_json() for r in rows],
    }
    for text in summary(rows, facts, peaks, shape, opts.service_variant, opts.cache_bytes, seconds):
        print(text)
    write_json(report, args.out, "bench")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.warmup = 0.3 if args.warmup is None else args.warmup
        args.concurrency = [1, 8] if args.concurrency == [1, 8, 32, 128] else args.concurrency
        args.texts = [1, 4] if args.texts == [1, 16] else args.texts
        args.batch_sizes = [1, 8]
        args.raw_seconds = 0.0
        with quick_model() as (model, source):
            report = run(args, model, source, naive_twin=False)
    else:
        manifest = json.loads((args.model / "manifest.json").read_text())
        source = Path(manifest["source"]["model"])
        naive_source = source if source.is_dir() else None
        twin = manifest["source"]["weights"] == "random" and not any(
            (source / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")
        )
        report = run(args, args.model, naive_source, twin)
    errors = sum(r["errors"] or 0 for r in report["rows"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
