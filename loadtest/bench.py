"""One run, one table: the raw ONNX Runtime ceiling, our service over HTTP, a naive PyTorch service, and the
cache, on the same corpus and the same machine.

    python -m loadtest.bench [--model DIR] [--variants fp32,int8] [--duration 10] \
        [--concurrency 1,8,32,128] [--skip-naive] [--quick]

Rows:
  raw       the encoder session in-process on the corpus sorted by length, whole passes, at the best of a
            few batch sizes, per variant (latency columns: per batch); batch 1 is also shown because its
            p50 is the single-sentence latency the concurrency-1 target is measured against.
  service   ``python -m app`` (cache off) driven by loadtest.loadgen at each concurrency with 1 and 16
            texts per request, texts drawn from the shuffled corpus.
  naive     loadtest/baselines/naive_service.py (PyTorch fp32, one forward per request) at the
            concurrencies up to 32: beyond that its queue takes minutes to drain and says nothing new.
  cache     ``python -m app`` with a cache budget: 100% hits (64 sentences, sent once before the cell)
            and 0% hits (each text made unique by a number in front), concurrency 32, 1 text each.

The service/raw ratio of the concurrency-32 cell uses a raw pass run right before and right after that
cell (their mean), so drift on a shared machine affects both sides alike. Results go to
loadtest/results/bench-<time>.json. The service is started with MAX_CONCURRENT_INPUTS raised to the
largest offered load (concurrency × texts), so that admission control does not turn the top cells into
429s; everything else is the default configuration.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvloop

from loadtest import loadgen
from loadtest.corpus import load_corpus, token_ids
from loadtest.flops import BertShape, gemm_peak
from loadtest.raw_onnx import CeilingResult, ceiling, open_encoder, shape_of, variants_in
from loadtest.server import HOST, ServiceProcess

RESULTS = Path(__file__).parent / "results"
HIT_SET = 64


@dataclass
class Row:
    """One line of the table."""

    kind: str  # raw | service | naive | cache
    label: str
    sentences_per_s: float | None
    requests_per_s: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    errors: int | None
    useful_gflops: float | None = None
    peak_share: float | None = None
    vs_raw: float | None = None
    vs_naive: float | None = None
    client_cores: float | None = None
    server_cores: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Options:
    model: Path
    variants: list[str]
    service_variant: str
    duration: float
    warmup: float
    concurrency: list[int]
    texts_per_request: list[int]
    batch_sizes: list[int]
    raw_seconds: float
    naive_max_concurrency: int
    skip_naive: bool
    cache_bytes: int
    naive_source: Path | None
    naive_twin: bool
    logs: Path


# --------------------------------------------------------------------------------------------- raw


def raw_rows(
    opts: Options, ids: list[np.ndarray], shape: BertShape, peaks: dict[str, float]
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


def _bodies(corpus: list[str], per_request: int, seed: int = 0) -> list[bytes]:
    texts = corpus[:]
    random.Random(seed).shuffle(texts)
    if per_request == 1:
        return [orjson.dumps({"inputs": t}) for t in texts]
    ring = texts + texts[:per_request]
    return [orjson.dumps({"inputs": ring[i : i + per_request]}) for i in range(0, len(texts), per_request)]


def _cycle(bodies: list[bytes], texts: int) -> loadgen.BodyFactory:
    return lambda n: (bodies[n % len(bodies)], texts)


def _looks_like_vectors(payload: bytes, _texts: int) -> bool:
    return payload[:2] == b"[[" or payload[:1] == b"["


def _cell(
    svc: ServiceProcess, path: str, make: loadgen.BodyFactory, concurrency: int, opts: Options
) -> tuple[loadgen.CellResult, float]:
    """One load cell; returns the result and the server's CPU cores used over the whole cell."""
    cpu0, t0 = svc.cpu_seconds(), time.perf_counter()
    result = uvloop.run(
        loadgen.run_cell(
            HOST, svc.port, path, make, concurrency, opts.duration, opts.warmup, check=_looks_like_vectors
        )
    )
    cores = (svc.cpu_seconds() - cpu0) / (time.perf_counter() - t0)
    return result, cores


# A closed-loop cell counts the requests that end in its window. When a request takes a good part of the
# window, which ones end inside it depends on phase (length-grouped batches finish many requests at once),
# so the rate is noise; such rows say so rather than report it as a measurement.
MIN_WINDOW_PER_P50 = 3.0


def _http_row(kind: str, label: str, r: loadgen.CellResult, server_cores: float, note: str = "") -> Row:
    if r.first_error:
        note = (note + "; " if note else "") + f"first error: {r.first_error[:120]}"
    warning = None
    if not r.latencies_ms and not r.errors:
        warning = "UNRELIABLE rate: no request ended in the window (longer --duration)"
    elif r.latencies_ms and r.percentile(50) * MIN_WINDOW_PER_P50 > r.wall_s * 1000:
        warning = (
            f"UNRELIABLE rate: window {r.wall_s:.0f} s < {MIN_WINDOW_PER_P50:.0f}x p50 (longer --duration)"
        )
    if warning:
        note = (note + "; " if note else "") + warning
    return Row(
        kind=kind,
        label=label,
        sentences_per_s=r.sentences_per_s,
        requests_per_s=r.requests_per_s,
        p50_ms=r.percentile(50),
        p90_ms=r.percentile(90),
        p99_ms=r.percentile(99),
        errors=r.errors,
        client_cores=r.client_cores,
        server_cores=server_cores,
        note=note,
        extra={"status_counts": {str(k): v for k, v in r.status_counts.items()}},
    )


def _engine_stats(svc: ServiceProcess) -> dict[str, Any]:
    status, info = uvloop.run(loadgen.get_json(HOST, svc.port, "/info"))
    if status != 200 or not isinstance(info, dict):
        raise RuntimeError(f"/info answered {status}")
    stats = info.get("stats", {})
    return stats if isinstance(stats, dict) else {}


def _padding(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    real = after.get("real_tokens", 0) - before.get("real_tokens", 0)
    padded = after.get("padded_tokens", 0) - before.get("padded_tokens", 0)
    return 1 - real / padded if padded else None


def _service_env(opts: Options, cache_bytes: int) -> dict[str, str]:
    peak_inputs = max(opts.concurrency) * max(opts.texts_per_request)
    return {
        "ZHEMBED_MODEL": str(opts.model),
        "ZHEMBED_VARIANT": opts.service_variant,
        "ZHEMBED_LOG_LEVEL": "warning",
        "ZHEMBED_CACHE_BYTES": str(cache_bytes),
        "ZHEMBED_MAX_CONCURRENT_INPUTS": str(max(512, peak_inputs)),
    }


def service_rows(
    opts: Options,
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
        facts["rss_after_start"] = svc.rss_bytes()
        for per_request in opts.texts_per_request:
            make = _cycle(_bodies(corpus, per_request), per_request)
            for c in opts.concurrency:
                before_raw = bracket() if bracket and c == 32 and per_request == 1 else None
                before = _engine_stats(svc)
                result, server_cores = _cell(svc, "/embed", make, c, opts)
                after = _engine_stats(svc)
                after_raw = bracket() if bracket and before_raw is not None else None
                padding = _padding(before, after)
                batches = after.get("batches", 0) - before.get("batches", 0)
                items = after.get("batched_items", 0) - before.get("batched_items", 0)
                note = f"padding {padding:.1%}" if padding is not None else ""
                if batches:
                    note += f"; mean batch {items / batches:.1f}"
                row = _http_row("service", f"service c={c} x{per_request}", result, server_cores, note)
                row.useful_gflops = result.sentences_per_s * flops_per_sentence / 1e9
                row.extra.update(padding_share=padding, engine_before=before, engine_after=after)
                if raw_best is not None:
                    row.vs_raw = result.sentences_per_s / raw_best.sentences_per_s
                    if after_raw is not None and before_raw is not None:
                        adjacent = (before_raw + after_raw) / 2
                        row.vs_raw = result.sentences_per_s / adjacent
                        row.extra["raw_adjacent_sentences_per_s"] = [before_raw, after_raw]
                        row.note += f"; vs raw pass adjacent ({before_raw:.1f}/{after_raw:.1f} s/s)"
                rows.append(row)
                print(_line(row), flush=True)
        facts["rss_steady"] = svc.rss_bytes()
        facts["pid_status_vmhwm"] = _vmhwm(svc.pid)
    return rows, facts


def _vmhwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def naive_rows(opts: Options, corpus: list[str]) -> list[Row]:
    if opts.naive_source is None:
        return []
    env = {"NAIVE_MODEL": str(opts.naive_source), "NAIVE_TWIN": "1" if opts.naive_twin else "0"}
    rows: list[Row] = []
    with ServiceProcess("loadtest.baselines.naive_service", env, opts.logs / "naive.log") as svc:
        for body in _bodies(
            corpus[:8], 1
        ):  # PyTorch's first calls pay one-off set-up; not the baseline's cost
            uvloop.run(loadgen.post(HOST, svc.port, "/embed", body))
        for per_request in opts.texts_per_request:
            make = _cycle(_bodies(corpus, per_request), per_request)
            for c in (c for c in opts.concurrency if c <= opts.naive_max_concurrency):
                result, server_cores = _cell(svc, "/embed", make, c, opts)
                row = _http_row("naive", f"naive c={c} x{per_request}", result, server_cores)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


_METRIC = re.compile(rb'^zhembed_cache_(hits|misses)_total\{tier="memory"\} ([0-9.e+]+)$', re.M)


def _cache_counts(svc: ServiceProcess) -> dict[str, float] | None:
    """Memory-tier hits and misses from /metrics; None when the service has no cache."""
    status, payload = uvloop.run(loadgen.get_json(HOST, svc.port, "/metrics"))
    if status != 200 or not isinstance(payload, str):
        return None
    text = payload.encode()
    found = {m.group(1).decode(): float(m.group(2)) for m in _METRIC.finditer(text)}
    if not found and b"zhembed_cache_hits" not in text:
        return None
    return {"hits": found.get("hits", 0.0), "misses": found.get("misses", 0.0)}


def cache_rows(opts: Options, corpus: list[str]) -> tuple[list[Row], dict[str, Any]]:
    labels = ("cache 100% hit c=32 x1", "cache 0% hit c=32 x1")
    c = 32 if 32 in opts.concurrency else max(opts.concurrency)
    labels = tuple(label.replace("c=32", f"c={c}") for label in labels)  # type: ignore[assignment]
    facts: dict[str, Any] = {"cache_bytes": opts.cache_bytes}
    with ServiceProcess("app", _service_env(opts, opts.cache_bytes), opts.logs / "service-cache.log") as svc:
        if _cache_counts(svc) is None:
            return [
                _na(label, "n/a (no cache): /metrics has no zhembed_cache_* counters") for label in labels
            ], facts
        hot = _bodies(corpus[:HIT_SET], 1)
        for body in hot:  # fill the cache with the hit set
            uvloop.run(loadgen.post(HOST, svc.port, "/embed", body))
        shuffled = corpus[:]
        random.Random(1).shuffle(shuffled)

        def unique(n: int) -> tuple[bytes, int]:
            return orjson.dumps({"inputs": f"{n:07d} {shuffled[n % len(shuffled)]}"}), 1

        rows: list[Row] = []
        for label, make in ((labels[0], _cycle(hot, 1)), (labels[1], unique)):
            before = _cache_counts(svc) or {}
            result, server_cores = _cell(svc, "/embed", make, c, opts)
            after = _cache_counts(svc) or {}
            hits = after.get("hits", 0) - before.get("hits", 0)
            misses = after.get("misses", 0) - before.get("misses", 0)
            ratio = hits / (hits + misses) if hits + misses else float("nan")
            row = _http_row("cache", label, result, server_cores, f"measured hit ratio {ratio:.1%}")
            rows.append(row)
            print(_line(row), flush=True)
        facts["rss_steady"] = svc.rss_bytes()
    return rows, facts


def _na(label: str, why: str) -> Row:
    return Row("cache", label, None, None, None, None, None, None, note=why)


# ------------------------------------------------------------------------------------------- table

HEADER = (
    f"{'row':<28} {'sent/s':>9} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'err':>5} "
    f"{'GFLOP/s':>8} {'%peak':>6} {'svc/raw':>7} {'svc/nv':>7} {'cli cpu':>7} {'srv cpu':>7}  note"
)


def _f(value: float | None, fmt: str, width: int) -> str:
    return f"{value:{width}{fmt}}" if value is not None and value == value else f"{'-':>{width}}"


def _line(r: Row) -> str:
    if r.sentences_per_s is None:
        return f"{r.label:<28} {r.note}"
    return (
        f"{r.label:<28} {_f(r.sentences_per_s, '.1f', 9)} {_f(r.requests_per_s, '.1f', 9)} "
        f"{_f(r.p50_ms, '.1f', 8)} {_f(r.p90_ms, '.1f', 8)} {_f(r.p99_ms, '.1f', 8)} {_f(r.errors, 'd', 5)} "
        f"{_f(r.useful_gflops, '.1f', 8)} {_f(None if r.peak_share is None else r.peak_share * 100, '.0f', 6)} "
        f"{_f(r.vs_raw, '.2f', 7)} {_f(r.vs_naive, '.1f', 7)} {_f(r.client_cores, '.2f', 7)} "
        f"{_f(r.server_cores, '.2f', 7)}  {r.note}"
    )


def _link_naive(rows: list[Row], peaks: dict[str, float], opts: Options) -> None:
    naive = {r.label.removeprefix("naive "): r for r in rows if r.kind == "naive"}
    for r in rows:
        if r.kind == "service":
            twin = naive.get(r.label.removeprefix("service "))
            if twin is not None and twin.sentences_per_s:
                r.vs_naive = (r.sentences_per_s or 0) / twin.sentences_per_s
        if r.kind == "service" and r.useful_gflops is not None:
            r.peak_share = r.useful_gflops * 1e9 / peaks[opts.service_variant]


def _naive_flops(rows: list[Row], ids: list[np.ndarray], shape: BertShape, peaks: dict[str, float]) -> None:
    per_sentence = float(np.mean([shape.flops(len(x)) for x in ids]))
    for r in rows:
        if r.kind == "naive" and r.sentences_per_s is not None:
            r.useful_gflops = r.sentences_per_s * per_sentence / 1e9
            r.peak_share = r.useful_gflops * 1e9 / peaks["fp32"]


def targets(rows: list[Row], facts: dict[str, Any], variant: str) -> list[str]:
    """Issue 5's targets, each with its measured value."""
    by = {r.label: r for r in rows}
    out: list[str] = []

    def say(name: str, ok: bool | None, detail: str) -> None:
        mark = "n/a " if ok is None else ("PASS" if ok else "MISS")
        out.append(f"  [{mark}] {name}: {detail}")

    svc32 = by.get("service c=32 x1")
    if svc32 and svc32.vs_raw is not None:
        say("c=32 x1 >= 0.90 x raw ceiling", svc32.vs_raw >= 0.9, f"{svc32.vs_raw:.2f}")
    svc1 = by.get("service c=1 x1")
    raw1 = next(
        (
            r
            for r in rows
            if r.kind == "raw" and r.extra.get("variant") == variant and r.extra.get("batch_size") == 1
        ),
        None,
    )
    if svc1 and raw1 and svc1.p50_ms is not None and raw1.p50_ms is not None:
        limit = 1.15 * raw1.p50_ms + 1
        say(
            "c=1 p50 <= 1.15 x raw single + 1 ms",
            svc1.p50_ms <= limit,
            f"{svc1.p50_ms:.1f} ms vs {limit:.1f} ms",
        )
    if svc32 and svc32.vs_naive is not None:
        say("c=32 >= 10 x naive", svc32.vs_naive >= 10, f"{svc32.vs_naive:.1f}x")
    if svc32 and svc32.extra.get("padding_share") is not None:
        share = svc32.extra["padding_share"]
        say("padding <= 10% at c=32", share <= 0.10, f"{share:.1%}")
    hit = next((r for r in rows if r.label.startswith("cache 100%")), None)
    if hit is not None:
        rps = hit.requests_per_s
        say(
            "100%-hit >= 2000 req/s",
            None if rps is None else rps >= 2000,
            hit.note if rps is None else f"{rps:.0f}",
        )
    if "rss_steady" in facts and "model_bytes" in facts:
        limit = 1.5 * facts["model_bytes"] + facts.get("cache_budget", 0)
        say(
            "RSS <= 1.5 x model + cache budget",
            facts["rss_steady"] <= limit,
            f"{facts['rss_steady'] / 2**20:.0f} MiB vs {limit / 2**20:.0f} MiB "
            f"(model {facts['model_bytes'] / 2**20:.0f} MiB, service started with cache off)",
        )
    return out


# -------------------------------------------------------------------------------------------- main


@contextmanager
def _quick_model() -> Iterator[tuple[Path, Path]]:
    """A tiny BERT (3 layers, hidden 64, real vocab) exported into a temp dir: (model dir, HF source)."""
    from export.pipeline import ExportOptions, run_export
    from tests.conftest import make_tiny_source

    with tempfile.TemporaryDirectory(prefix="zhembed-bench-") as tmp:
        source = make_tiny_source(Path(tmp) / "source")
        out = Path(tmp) / "model"
        run_export(ExportOptions(out=out, model=str(source), variants=("fp32", "int8")), log=lambda _l: None)
        yield out, source


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
    p.add_argument("--concurrency", default="1,8,32,128")
    p.add_argument("--texts", default="1,16", help="texts per request")
    p.add_argument("--batch-sizes", default="1,4,8,16", help="raw-ceiling batch sizes to try")
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
    opts = Options(
        model=model,
        variants=[v for v in wanted if v in present and v != "fp16"],  # fp16 only pays on CUDA
        service_variant=args.service_variant,
        duration=args.duration,
        warmup=args.warmup if args.warmup is not None else min(2.0, args.duration / 4),
        concurrency=[int(c) for c in args.concurrency.split(",")],
        texts_per_request=[int(t) for t in args.texts.split(",")],
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        raw_seconds=args.raw_seconds,
        naive_max_concurrency=args.naive_max_concurrency,
        skip_naive=args.skip_naive,
        cache_bytes=args.cache_bytes,
        naive_source=naive_source,
        naive_twin=naive_twin,
        logs=RESULTS / "logs",
    )
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
    for r in raw:
        print(_line(r), flush=True)
    raw_best = best.get(opts.service_variant)
    bracket: Callable[[], float] | None = None
    if raw_best is not None:
        session = open_encoder(model, opts.service_variant)
        size = raw_best.batch_size

        def bracket() -> float:
            return ceiling(session, opts.service_variant, ids, size, shape, 0.0).sentences_per_s

    svc, facts = service_rows(opts, corpus, ids, shape, raw_best, bracket)
    bracket = None
    naive = [] if opts.skip_naive else naive_rows(opts, corpus)
    cache, cache_facts = cache_rows(opts, corpus)
    rows = raw + svc + naive + cache
    _naive_flops(rows, ids, shape, peaks)
    _link_naive(rows, peaks, opts)
    facts.update(
        model_bytes=sum(f["bytes"] for f in files),
        cache_budget=0,
        cache=cache_facts,
        gemm_peak_gflops={k: v / 1e9 for k, v in peaks.items()},
    )
    report = {
        "model": str(model),
        "service_variant": opts.service_variant,
        "corpus_sentences": len(corpus),
        "corpus_mean_tokens": float(np.mean([len(x) for x in ids])),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "seconds": time.time() - started,
        "facts": facts,
        "rows": [asdict(r) for r in rows],
    }
    print()
    print("=" * len(HEADER))
    print(f"{len(rows)} rows; measured on a shared machine; {report['seconds']:.0f} s")
    print(HEADER)
    for r in rows:
        print(_line(r))
    print()
    print(
        f"GEMM peak (one [512x768]x[768x3072] MatMul in ONNX Runtime): fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, "
        f"int8 MatMulInteger {peaks['int8'] / 1e9:.1f} GOP/s; %peak uses the row's precision (naive: fp32)."
    )
    print(
        "FLOPs per sentence of L tokens: 2*L*N*(4H^2 + 2HI) + 4*N*L^2*H + 2H^2 (useful: each sentence at its "
        f"own length); N={shape.layers}, H={shape.hidden}, I={shape.intermediate}."
    )
    print(
        f"Service RSS: {facts['rss_after_start'] / 2**20:.0f} MiB after start, {facts['rss_steady'] / 2**20:.0f} MiB "
        f"steady (peak {facts['pid_status_vmhwm'] / 2**20:.0f} MiB); {opts.service_variant} graphs "
        f"{facts['model_bytes'] / 2**20:.0f} MiB; cache off in the service rows"
        + (
            f"; with a {opts.cache_bytes / 2**20:.0f} MiB cache budget: "
            f"{cache_facts['rss_steady'] / 2**20:.0f} MiB after the cache rows"
            if "rss_steady" in cache_facts
            else ""
        )
    )
    print("Targets (issue 5):")
    for line in targets(rows, facts, opts.service_variant):
        print(line)
    out = args.out or RESULTS / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float))
    print(f"JSON: {out}")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.warmup = 0.3 if args.warmup is None else args.warmup
        args.concurrency = "1,8" if args.concurrency == "1,8,32,128" else args.concurrency
        args.texts = "1,4" if args.texts == "1,16" else args.texts
        args.batch_sizes = "1,8"
        args.raw_seconds = 0.0
        with _quick_model() as (model, source):
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
