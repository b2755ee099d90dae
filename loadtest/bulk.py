"""The bulk job against the raw ONNX Runtime ceiling, on Ray, and its memory: one run, one table.

    python -m loadtest.bulk [--model TWIN] [--texts 3000] [--batch-sizes 8,16,32] [--skip-ray]
                            [--memory-rows 10000,1000000] [--memory-model TWIN --memory-text char] [--quick]

Rows ``raw`` (tokenising included), ``job`` (``python -m app.bulk``'s data path in-process), ``ray`` (the
same on a local Ray) and ``memory`` (peak RSS of ``python -m app.bulk`` per row count), then issue 27's
targets: job ≥ 0.95 × raw; ray ≥ 0.85 × job; memory ratio ≤ 1.2. docs/performance.md has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from app.bulk import flags
from app.bulk.cli import parser as bulk_parser
from app.bulk.embedder import Embedder
from app.bulk.output import OutputDir
from app.bulk.progress import Progress
from app.bulk.runner import BulkSpec, manifest_of, prepare, run_local
from app.bulk.sources import Fields, find_inputs
from app.settings import Settings
from loadtest import procs
from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness import TWIN, parser
from loadtest.harness.report import mark
from loadtest.quick_model import tiny_model
from loadtest.raw_onnx import ceiling


def write_corpus(path: Path, texts: Iterable[str]) -> Path:
    with open(path, "wb") as f:
        for text in texts:
            f.write(orjson.dumps({"text": text}) + b"\n")
    return path


def job_of(
    corpus: Path, out: Path, model: Path, variant: str, batch: int, extra: list[str]
) -> tuple[argparse.Namespace, BulkSpec, Settings]:
    """``python -m app.bulk``'s flags for the run, its job and its settings."""
    model_flags = ["--model", str(model), "--variant", variant, "--max-batch-size", str(batch)]
    model_flags += ["--max-batch-tokens", str(max(4096, batch * 128))]
    args = bulk_parser().parse_args(
        [*model_flags, "--input", str(corpus), "--output", str(out), "--progress", "off", *extra]
    )
    fields = Fields()
    inputs = find_inputs(str(corpus), None, fields)
    job = BulkSpec(inputs, fields, out, args.shard_rows, "float", str(corpus), None)
    return args, job, flags.settings_of(args, str(model))


def job_run(corpus: Path, out: Path, model: Path, variant: str, batch: int) -> dict[str, float]:
    """The single-machine job's data path, timed from the first row read to the finished folder."""
    args, job, settings = job_of(corpus, out, model, variant, batch, [])
    embedder = Embedder(settings, {}, "text", args.window)

    async def go() -> tuple[float, dict[str, Any]]:
        await embedder.check()
        _, manifest = prepare(OutputDir(out), manifest_of(job, embedder, str(model)), overwrite=True)
        started = time.perf_counter()
        done = await run_local(job, embedder, manifest, Progress("off"))
        return time.perf_counter() - started, done

    try:
        seconds, manifest = asyncio.run(go())
        stats = embedder.engine.stats()
    finally:
        embedder.close()
    padding = 1 - stats["real_tokens"] / max(stats["padded_tokens"], 1)
    return {"sentences_per_s": manifest["counts"]["embedded"] / seconds, "padding": padding}


def ray_run(corpus: Path, out: Path, model: Path, variant: str, batch: int, cores: int) -> dict[str, float]:
    """The Ray path on a local Ray of ``cores`` CPUs and one actor: the pipeline and the commit."""
    import ray

    from app.bulk.ray_job import execute, prepare_ray

    args, job, settings = job_of(corpus, out, model, variant, batch, ["--ray", "--overwrite"])
    settings, manifest, _ = prepare_ray(job, settings, {}, args)
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
    try:
        started = time.perf_counter()
        done = execute(job, settings, {}, args, manifest)
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    return {"sentences_per_s": done["counts"]["embedded"] / seconds, "seconds": seconds}


def row_texts(rows: int, kind: str) -> Iterator[str]:
    """The memory rows' texts: ``numbered``, distinct short texts (a number and 12 corpus characters);
    ``char``, one corpus character a row (three tokens with [CLS] and [SEP]: the least a row can cost a
    large model, so a million rows of the twin fit in a session)."""
    base = load_corpus()
    if kind == "char":
        chars = sorted({c for line in base for c in line if not c.isspace()})
        return (chars[n % len(chars)] for n in range(rows))
    return (f"{n} {base[n % len(base)][:12]}" for n in range(rows))


def peak_rss_mib(model: Path, rows: int, work: Path, text: str = "numbered") -> tuple[float, float]:
    """Peak RSS (MiB) of ``python -m app.bulk`` embedding ``rows`` rows (:func:`row_texts`) with the int8
    graph of ``model``, and its seconds. The peak is the child's own ``VmHWM``, read until it exits
    (``ru_maxrss`` would not do: Linux keeps the forking parent's high-water mark across the exec)."""
    corpus = write_corpus(work / f"rows-{rows}.jsonl", row_texts(rows, text))
    out = work / f"out-{rows}"
    batch = "256" if text == "char" else "64"  # three-token rows: a large model needs wide batches
    flags = ["--model", str(model), "--variant", "int8", "--input", str(corpus), "--output", str(out)]
    flags += ["--progress", "off", "--overwrite", "--max-batch-size", batch]
    started = time.perf_counter()
    command = [sys.executable, "-m", "app.bulk", *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while process.poll() is None:
        with contextlib.suppress(OSError):  # exiting: its last reading stands
            peak = max(peak, procs.peak_rss(process.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"the bulk job on {rows} rows failed: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    corpus.unlink()
    return peak / procs.MB, seconds


def main(argv: list[str] | None = None) -> int:
    quick = "tiny model, 300 texts, 2,000 / 20,000 memory rows"
    p = parser("loadtest.bulk", __doc__, quick, model=TWIN)
    p.add_argument("--variant", default="int8")
    p.add_argument("--texts", type=int, default=3000, help="distinct texts of the speed rows")
    p.add_argument("--batch-sizes", default="8,16,32", help="raw batch sizes to pick the best of")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--memory-rows", default=None, help="row counts (default 10000,1000000); empty: none")
    p.add_argument("--memory-model", type=Path, default=None, help="the memory rows' model (default: tiny)")
    text = "numbered: distinct short texts; char: one character a row (3 tokens)"
    p.add_argument("--memory-text", choices=("numbered", "char"), default="numbered", help=text)
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    rows = "2000,20000" if args.quick else "10000,1000000"
    sizes = [int(n) for n in (rows if args.memory_rows is None else args.memory_rows).split(",") if n]
    with tempfile.TemporaryDirectory(prefix="zhembed-bulk-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        tiny = stack.enter_context(tiny_model(None, ("fp32", "int8"), 3)) if args.quick else None
        if tiny is not None:
            args.model, args.texts = tiny, 300
        lines = [] if args.skip_speed else speed_rows(args, work, cores)
        if sizes:
            given: Path | None = args.memory_model
            memory_model = given or tiny or stack.enter_context(tiny_model(None, ("fp32", "int8"), 3))
            name = "tiny model" if given is None else given.name
            peaks = {n: peak_rss_mib(memory_model, n, work, args.memory_text) for n in sizes}
            for n, (mib, seconds) in peaks.items():
                lines.append(
                    f"| memory, {n:,} rows ({name}, {args.memory_text} rows) | peak RSS {mib:.0f} MiB | {n / seconds:,.0f} rows/s incl. start | |"
                )
            ratio = peaks[max(sizes)][0] / peaks[min(sizes)][0]
            lines.append(
                f"| memory ratio {max(sizes):,} / {min(sizes):,} rows | {ratio:.2f} | target ≤ 1.2 | {mark(ratio <= 1.2)} |"
            )
    print(f"\nbulk job, {cores} cores" + ("" if args.skip_speed else f", speed rows on {args.model}") + "\n")
    print("| row | figure | note | target |\n|---|---|---|---|")
    print("\n".join(lines))
    return 0


def speed_rows(args: argparse.Namespace, work: Path, cores: int) -> list[str]:
    texts = unique_texts(load_corpus(), 0, args.texts)
    corpus = write_corpus(work / "corpus.jsonl", texts)
    sample = texts[: max(len(texts) // 6, 64)]
    # One whole pass, tokenising included (as the engine's tokenisation thread).
    raw = partial(ceiling, args.model, args.variant, min_seconds=0.0, tokenize=True)
    picks = {b: raw(sample, int(b)).sentences_per_s for b in args.batch_sizes.split(",")}
    best = int(max(picks, key=lambda b: picks[b]))
    tried = ", ".join(f"{b}: {v:.1f}/s" for b, v in picks.items())
    print(f"raw on a sixth of the corpus, by batch size: {tried}")
    before = raw(texts, best)
    job = job_run(corpus, work / "out-job", args.model, args.variant, best)
    ray = None if args.skip_ray else ray_run(corpus, work / "out-ray", args.model, args.variant, best, cores)
    after = raw(texts, best)
    ceiling_rate = (before.sentences_per_s + after.sentences_per_s) / 2
    vs_raw = job["sentences_per_s"] / ceiling_rate
    lines = [
        f"| raw {args.variant}, batch {best}, tokenising included | {ceiling_rate:.1f} sentences/s | before / after the job: "
        f"{before.sentences_per_s:.1f} / {after.sentences_per_s:.1f}; padding {before.padding_share:.1%}; tokenising "
        f"{before.tokenize_s:.2f} s | |",
        f"| job (read, embed, write Parquet) | {job['sentences_per_s']:.1f} sentences/s | {vs_raw:.2f} × raw; padding "
        f"{job['padding']:.1%} | ≥ 0.95 × raw: {mark(vs_raw >= 0.95)} |",
    ]
    if ray is not None:
        vs_job = ray["sentences_per_s"] / job["sentences_per_s"]
        lines.append(
            f"| ray (local, {cores} CPUs, 1 actor) | {ray['sentences_per_s']:.1f} sentences/s | {vs_job:.2f} × job; "
            f"{ray['seconds']:.1f} s incl. actor start | ≥ 0.85 × job: {mark(vs_job >= 0.85)} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
