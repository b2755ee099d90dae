"""The raw ONNX Runtime ceiling, the service over HTTP, a naive PyTorch service and the cache in one table.

    python -m loadtest.bench [--model DIR] [--variants fp32,int8] [--duration 10] \
        [--concurrency 1,8,32,128] [--texts 1,16] [--skip-naive] [--quick]

Rows ``raw`` (per variant, best batch size and batch 1), ``service c=C xT``, ``naive c=C xT`` (up to
``--naive-max-concurrency``) and ``cache 100% / 0% hit``; columns sent/s, req/s, p50/p90/p99 ms, err,
GFLOP/s, %peak, svc/raw, svc/nv, client and server cores. Then issue 5's targets as PASS / MISS, and
JSON in loadtest/results/bench-<time>.json. docs/performance.md has the current figures,
docs/performance-log.md every run.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from app.model.manifest import load_manifest
from app.settings import Settings
from loadtest import loadgen, procs, raw_onnx
from loadtest.corpus import HIT_SET, encode, load_corpus, request_bodies, tokenizer_of
from loadtest.harness import TWIN, parser
from loadtest.harness.cell import Cell, distinct_bodies
from loadtest.harness.measure import measure
from loadtest.harness.report import NAN, RESULTS, Column, Goal, Row, Table, joined, target, write_json
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.raw_onnx import BertShape, CeilingResult, ceiling, gemm_peak, shape_of
from loadtest.server import ServiceProcess, post

# The service's batch size (its default max_batch_size): the sparse head's cost is timed at it.
SERVICE_BATCH = int(Settings.model_fields["max_batch_size"].default)
HITS, MISSES = 'zhembed_cache_hits_total{tier="memory"}', 'zhembed_cache_misses_total{tier="memory"}'
GFLOPS, PEAK = Column("GFLOP/s", 8, ".1f", "useful_gflops"), Column("%peak", 6, ".0%", "peak_share")
VS_RAW, VS_NAIVE = Column("svc/raw", 7, ".2f", "vs_raw"), Column("svc/nv", 7, ".1f", "vs_naive")
LATENCY = ("p50 ms", "p90 ms", "p99 ms")
TABLE = Table(
    "row", 28, "sent/s", "req/s", *LATENCY, "err", GFLOPS, PEAK, VS_RAW, VS_NAIVE, "cli cpu", "srv cpu"
)


def shown(rows: list[Row]) -> list[Row]:
    for r in rows:
        print(TABLE.row(r), flush=True)
    return rows


def raw_rows(opts: argparse.Namespace, peaks: dict[str, float]) -> tuple[list[Row], dict[str, CeilingResult]]:
    """Per variant, the best batch size's row and batch 1's (its latency is per sentence)."""
    rows: list[Row] = []
    best: dict[str, CeilingResult] = {}
    for variant in opts.variants:
        results = [ceiling(opts.model, variant, opts.corpus, b, opts.raw_seconds) for b in opts.batch_sizes]
        top = best[variant] = max(results, key=lambda r: r.sentences_per_s)
        tried = ", ".join(f"b{r.batch_size}={r.sentences_per_s:.1f}" for r in results)
        chosen = [
            (top, f"raw {variant} best b={top.batch_size}", f"padding {top.padding_share:.1%}; tried {tried}")
        ]
        chosen += [(r, f"raw {variant} b=1", "latency = per sentence") for r in results if r.batch_size == 1]
        for r, label, note in chosen[: 1 if top.batch_size == 1 else 2]:
            p50, p90, p99 = (float(x) for x in np.percentile(r.batch_ms, [50, 90, 99]))
            flops = {"computed_gflops": r.computed_flops_per_s / 1e9, "passes": r.passes}
            rows.append(
                Row(
                    label,
                    "raw",
                    sentences_per_s=r.sentences_per_s,
                    requests_per_s=r.batches_per_s,
                    p50_ms=p50,
                    p90_ms=p90,
                    p99_ms=p99,
                    errors=0,
                    useful_gflops=r.useful_flops_per_s / 1e9,
                    peak_share=r.useful_flops_per_s / peaks[variant],
                    note=note,
                    extra={"variant": variant, "batch_size": r.batch_size, **flops},
                )
            )
    return shown(rows), best


def _service(opts: argparse.Namespace, cache_bytes: int, log: str) -> ServiceProcess:
    peak_inputs = max(opts.concurrency) * max(opts.texts)
    env = service_env(opts.model, opts.service_variant, peak_inputs, cache_bytes=cache_bytes)
    return ServiceProcess("app", env, opts.logs / log)


def service_rows(
    opts: argparse.Namespace, raw_best: CeilingResult | None, bracket: Callable[[], float] | None
) -> tuple[list[Row], dict[str, Any]]:
    """Each cell on the service, cache off; c=32 x1 also against raw passes right before and after it."""
    rows: list[Row] = []
    facts: dict[str, Any] = {}
    with _service(opts, 0, "service.log") as svc:
        facts["memory_after_start"] = procs.tree(svc.pid).as_json()
        for per_request, c, route in itertools.product(opts.texts, opts.concurrency, opts.routes):
            label = f"service c={c} x{per_request}" + ("" if route == "/embed" else f" {route}")
            bodies = request_bodies(opts.corpus, per_request)
            if route == "/embed_sparse" and opts.sparse_top_k:
                bodies = [orjson.dumps({**orjson.loads(b), "top_k": opts.sparse_top_k}) for b in bodies]
                label += f" top_k={opts.sparse_top_k}"
            before_raw = bracket() if bracket and c == 32 and per_request == 1 else None
            before = svc.engine_stats()
            make = loadgen.cycle(bodies, per_request)
            m = measure(
                svc, Cell(c, per_request, route=route), make, opts.duration, opts.warmup, metrics=False
            )
            row = Row.of(m, label=label)
            after = svc.engine_stats()
            keys = ("real_tokens", "padded_tokens", "batches", "batched_items")
            moved = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
            padding = 1 - moved["real_tokens"] / moved["padded_tokens"] if moved["padded_tokens"] else None
            batch = f"mean batch {moved['batched_items'] / moved['batches']:.1f}" if moved["batches"] else ""
            row.note = joined(f"padding {padding:.1%}" if padding is not None else "", batch, row.note)
            row.useful_gflops = (row.sentences_per_s or 0.0) * opts.flops_per_sentence / 1e9
            row.extra.update(padding_share=padding, engine_before=before, engine_after=after)
            adjacent = [before_raw, bracket()] if bracket and before_raw is not None else []
            if adjacent:
                row.extra["raw_adjacent_sentences_per_s"] = adjacent
                row.note += f"; vs raw pass adjacent ({adjacent[0]:.1f}/{adjacent[1]:.1f} s/s)"
            if raw_best is not None:
                raw = sum(adjacent) / 2 if adjacent else raw_best.sentences_per_s
                row.vs_raw = (row.sentences_per_s or 0.0) / raw
            rows += shown([row])
        facts["memory_steady"] = procs.tree(svc.pid).as_json()
    return rows, facts


def naive_rows(opts: argparse.Namespace) -> list[Row]:
    if opts.naive_source is None:
        return []
    env = {"NAIVE_MODEL": str(opts.naive_source), "NAIVE_TWIN": "1" if opts.naive_twin else "0"}
    rows: list[Row] = []
    with ServiceProcess("loadtest.baselines.naive_service", env, opts.logs / "naive.log") as svc:
        for body in request_bodies(opts.corpus[:8], 1):  # PyTorch's first calls pay one-off set-up
            post(svc.port, "/embed", body)
        for per_request in opts.texts:
            make = loadgen.cycle(request_bodies(opts.corpus, per_request), per_request)
            for c in (c for c in opts.concurrency if c <= opts.naive_max_concurrency):
                m = measure(svc, Cell(c, per_request), make, opts.duration, opts.warmup, metrics=False)
                rows += shown([Row.of(m, "naive", label=f"naive c={c} x{per_request}")])
    return rows


def cache_rows(opts: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    """100% hits on the hit set (put in the cache first), then 0%: texts never sent before."""
    c = 32 if 32 in opts.concurrency else max(opts.concurrency)
    labels = (f"cache 100% hit c={c} x1", f"cache 0% hit c={c} x1")
    facts: dict[str, Any] = {"cache_bytes": opts.cache_bytes}
    with _service(opts, opts.cache_bytes, "service-cache.log") as svc:
        hot = request_bodies(opts.corpus[:HIT_SET], 1)
        for body in hot:
            post(svc.port, "/embed", body)
        shuffled = random.Random(1).sample(opts.corpus, len(opts.corpus))
        rows: list[Row] = []
        for label, make in ((labels[0], loadgen.cycle(hot, 1)), (labels[1], distinct_bodies(shuffled, 1, 0))):
            m = measure(svc, Cell(c, 1), make, opts.duration, opts.warmup)
            row = Row.of(m, "cache", label=label)
            hits, misses = m.delta(HITS), m.delta(MISSES)
            ratio = hits / (hits + misses) if hits + misses else NAN
            row.note = joined(f"measured hit ratio {ratio:.1%}", row.note)
            rows += shown([row])
        facts["memory_steady"] = procs.tree(svc.pid).as_json()
    return rows, facts


def link_naive(
    rows: list[Row], peaks: dict[str, float], service_variant: str, flops_per_sentence: float
) -> None:
    """Fill the naive rows' useful GFLOP/s and % of the fp32 peak, and the service rows' % of their peak
    and service/naive ratio (against the same cell of the naive service)."""
    naive = {r.label.removeprefix("naive "): r for r in rows if r.kind == "naive"}
    for r in naive.values():
        if r.sentences_per_s is not None:
            r.useful_gflops = r.sentences_per_s * flops_per_sentence / 1e9
            r.peak_share = r.useful_gflops * 1e9 / peaks["fp32"]
    for r in (r for r in rows if r.kind == "service"):
        twin = naive.get(r.label.removeprefix("service "))
        if twin is not None and twin.sentences_per_s:
            r.vs_naive = (r.sentences_per_s or 0) / twin.sentences_per_s
        if r.useful_gflops is not None:
            r.peak_share = r.useful_gflops * 1e9 / peaks[service_variant]


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def targets(rows: list[Row], facts: dict[str, Any], variant: str) -> list[str]:
    """Issue 5's targets, each with its measured value (n/a where its row was not measured)."""
    by = {r.label: r for r in rows}
    svc32, svc1 = "service c=32 x1", "service c=1 x1"
    raw1 = by.get(f"raw {variant} b=1") or by.get(f"raw {variant} best b=1")
    single = 1.15 * raw1.p50_ms + 1 if raw1 and raw1.p50_ms is not None else NAN
    hit = next((r.label for r in rows if r.label.startswith("cache 100%")), "")
    vs_raw = "{:.1f} ms vs {bound:.1f} ms"
    goals = [
        Goal("c=32 x1 >= 0.90 x raw ceiling", svc32, "vs_raw", ">=", 0.9),
        Goal("c=1 p50 <= 1.15 x raw single + 1 ms", svc1, "p50_ms", "<=", single, vs_raw),
        Goal("c=32 >= 10 x naive", svc32, "vs_naive", ">=", 10, "{:.1f}x"),
        Goal("padding <= 10% at c=32", svc32, lambda r: r.extra.get("padding_share"), "<=", 0.1, "{:.1%}"),
    ]
    cache = Goal("100%-hit >= 2000 req/s", hit, "requests_per_s", ">=", 2000, "{:.0f}")
    out = [*(goal.line(by) for goal in goals), cache.line(by, by[hit].note if hit else "not measured")]
    if "memory_steady" in facts and "model_bytes" in facts:
        limit = 1.5 * facts["model_bytes"]  # and the cache budget: none, the service rows run with it off
        rss = facts["memory_steady"]["rss"]  # summed over the process tree: one process by default
        model = mib(facts["model_bytes"])
        detail = f"{mib(rss)} vs {mib(limit)} (model {model}, service started with cache off)"
        out.append(target("RSS <= 1.5 x model + cache budget", rss <= limit, detail))
    return out


def sparse_targets(rows: list[Row]) -> list[str]:
    """Issue 34's target: each ``/embed_sparse`` service row against the same cell of ``/embed``."""
    by = {r.label: r for r in rows if r.kind == "service"}
    out: list[str] = []
    for label in by:
        dense, route, top_k = label.partition(" /embed_sparse")
        if route and dense in by:
            name = f"/embed_sparse {dense.removeprefix('service ')}{top_k} >= 0.8 x /embed"
            shown, per = "{raw:.1f} / {per:.1f} sent/s = {:.2f}", by[dense].sentences_per_s
            out.append(Goal(name, label, "sentences_per_s", ">=", 0.8, shown, per).line(by))
    return out


def summary(
    rows: list[Row],
    facts: dict[str, Any],
    peaks: dict[str, float],
    shape: BertShape,
    service_variant: str,
    cache_bytes: int,
    seconds: float,
) -> list[str]:
    """The closing block: every row again, the GEMM peaks, the FLOP formula, memory, and the targets (issue
    34's and where the sparse route's time goes, when it was measured)."""
    start, steady = facts["memory_after_start"], facts["memory_steady"]
    sparse, cost = sparse_targets(rows), facts.get("sparse_cost")
    cached = facts.get("cache", {}).get("memory_steady")
    budget = ""
    if cached:
        budget = f"; with a {mib(cache_bytes)} cache budget: {mib(cached['rss'])} after the cache rows"
    return [
        "",
        "=" * len(TABLE.header),
        f"{len(rows)} rows; measured on a shared machine; {seconds:.0f} s",
        TABLE.header,
        *(TABLE.row(r) for r in rows),
        "",
        f"GEMM peak (one [512x768]x[768x3072] MatMul in ONNX Runtime): fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, "
        f"int8 MatMulInteger {peaks['int8'] / 1e9:.1f} GOP/s; %peak uses the row's precision (naive: fp32).",
        "FLOPs per sentence of L tokens: 2*L*N*(4H^2 + 2HI) + 4*N*L^2*H + 2H^2 (useful: each sentence at its "
        f"own length); N={shape.layers}, H={shape.hidden}, I={shape.intermediate}.",
        f"Service RSS, summed over its processes (loadtest.procs): {mib(start['rss'])} after start, "
        f"{mib(steady['rss'])} steady (each process's peak, summed: {mib(steady['peak_rss'])}); PSS (shared "
        f"pages once) {start['pss'] / 2**20:.0f} / {mib(steady['pss'])}; {service_variant} graphs "
        f"{mib(facts['model_bytes'])}; cache off in the service rows{budget}",
        *(
            f"  {p['role']} {p['pid']}: RSS {mib(p['rss'])}, PSS {mib(p['pss'])} steady"
            for p in (steady["processes"] if len(steady["processes"]) > 1 else [])
        ),
        "Targets (issue 5):",
        *targets(rows, facts, service_variant),
        *(["Targets (issue 34):", *sparse, *([cost["line"]] if cost else [])] if sparse or cost else []),
    ]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    quick = "tiny model in a temp dir, a few seconds in all"
    p = parser("loadtest.bench", __doc__, quick, model=TWIN, duration=10.0, warmup=None, out=None)
    p.add_argument("--variants", default=None, help="raw-ceiling variants; default fp32,int8 where present")
    p.add_argument("--service-variant", default="int8", help="ZHEMBED_VARIANT of the service rows")
    p.add_argument("--concurrency", type=ints, default="1,8,32,128")
    p.add_argument("--texts", type=ints, default="1,16", help="texts per request")
    p.add_argument("--routes", default="/embed", help="each cell on each in turn (e.g. /embed,/embed_sparse)")
    # A random-weight twin answers ~19,000 weights a text without it.
    p.add_argument("--sparse-top-k", type=int, default=None, help="top_k of the /embed_sparse rows")
    p.add_argument("--batch-sizes", type=ints, default="1,4,8,16", help="raw-ceiling batch sizes to try")
    p.add_argument("--raw-seconds", type=float, default=3.0, help="least time per raw batch size")
    p.add_argument("--naive-max-concurrency", type=int, default=32)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--cache-bytes", type=int, default=64 * 2**20, help="cache budget of the cache rows")
    args = p.parse_args(argv)
    args.routes = args.routes.split(",")
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.warmup = 0.3 if args.warmup is None else args.warmup
        args.concurrency = [1, 8] if args.concurrency == [1, 8, 32, 128] else args.concurrency
        args.texts = [1, 4] if args.texts == [1, 16] else args.texts
        args.batch_sizes, args.raw_seconds = [1, 8], 0.0
    args.warmup = args.warmup if args.warmup is not None else min(2.0, args.duration / 4)
    return args


def run(opts: argparse.Namespace, model: Path) -> dict[str, Any]:
    """Every row on ``model``; the naive service runs on the export's source folder, where it has one (a
    twin's, with no weights, on the twin's random weights)."""
    manifest = load_manifest(model)
    source = Path(manifest.source.model)
    weights = any((source / f).is_file() for f in ("model.safetensors", "pytorch_model.bin"))
    opts.naive_source = source if source.is_dir() else None
    opts.naive_twin = manifest.source.weights == "random" and not weights
    wanted = opts.variants.split(",") if opts.variants else ["fp32", "int8"]
    opts.variants = [v for v in wanted if v in manifest.variants and v != "fp16"]  # fp16 only pays on CUDA
    opts.model, opts.logs, opts.corpus = model, RESULTS / "logs", load_corpus()
    ids, shape = encode(tokenizer_of(model), opts.corpus), shape_of(model)
    mean_tokens = float(np.mean([len(x) for x in ids]))
    opts.flops_per_sentence = float(np.mean([shape.flops(len(x)) for x in ids]))
    files = [g[opts.service_variant] for g in manifest.graphs.values() if opts.service_variant in g]
    started = time.time()
    print(f"zhembed bench: {model} ({len(opts.corpus)} sentences, mean {mean_tokens:.1f} tokens)")
    print(TABLE.header, flush=True)
    peaks = {"fp32": gemm_peak("fp32"), "int8": gemm_peak("int8")}
    raw, best = raw_rows(opts, peaks)
    sparse: dict[str, Any] = {}
    if "/embed_sparse" in opts.routes:  # where the sparse route's time goes, beside its service rows
        cost = raw_onnx.sparse_cost(model, opts.service_variant, ids, SERVICE_BATCH, opts.raw_seconds)
        sparse["sparse_cost"] = (
            None if cost is None else {**asdict(cost), "share": cost.share, "line": cost.line()}
        )
        print(cost.line() if cost else f"{model} has no {opts.service_variant} sparse graph", flush=True)
    raw_best = best.get(opts.service_variant)

    def bracket() -> float:
        assert raw_best is not None
        return ceiling(model, opts.service_variant, ids, raw_best.batch_size, 0.0).sentences_per_s

    svc, facts = service_rows(opts, raw_best, bracket if raw_best is not None else None)
    facts.update(sparse)
    naive = [] if opts.skip_naive else naive_rows(opts)
    cache, cache_facts = cache_rows(opts)
    rows = raw + svc + naive + cache
    link_naive(rows, peaks, opts.service_variant, opts.flops_per_sentence)
    facts.update(
        model_bytes=sum(f.bytes for f in files),
        cache=cache_facts,
        gemm_peak_gflops={k: v / 1e9 for k, v in peaks.items()},
    )
    seconds = time.time() - started
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items() if k != "corpus"}
    report = {
        "model": str(model),
        "service_variant": opts.service_variant,
        "corpus_sentences": len(opts.corpus),
        "corpus_mean_tokens": mean_tokens,
        "options": options,
        "seconds": seconds,
        "facts": facts,
        "rows": [r.as_json() for r in rows],
    }
    print(*summary(rows, facts, peaks, shape, opts.service_variant, opts.cache_bytes, seconds), sep="\n")
    write_json(report, opts.out, "bench")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tiny_model(None, ("fp32", "int8"), 3) if args.quick else nullcontext(args.model) as model:
        report = run(args, model)
    return 1 if any(r["errors"] for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
