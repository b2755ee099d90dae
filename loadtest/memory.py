"""Where a worker's memory goes: the service's engine under load, one child process per allocator setting.

    python -m loadtest.memory                                  # the int8 twin, every variant, 3,000 requests
    python -m loadtest.memory --variants default,trim-off --requests 6000 --parallel 1

Each variant (``default``, ``trim-off``, ``mmap-only``, ``trim-only``, ``mmap-env``, ``arena-off``,
``arena-shrink``: docs/performance-log.md says what each is) runs the engine as a worker builds it, with
closed-loop clients sending 1 to ``--max-texts`` numbered corpus texts (``--max-chars``: each repeated or
cut to a random length). The table: USS once warmed up (the worker's warm-up included), after the first
``--step`` requests, at the middle and at the end, the most seen, the growth, and requests/s; every
reading as JSON in loadtest/results/memory-<time>.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from functools import partial
from typing import Any

import numpy as np
import psutil

from loadtest.harness import TWIN, parser
from loadtest.harness.report import write_json

OFF = {"ZHEMBED_MEMORY_TRIM_BATCHES": "0", "ZHEMBED_MMAP_THRESHOLD_KB": "0"}
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "trim-off": OFF,
    "mmap-only": {"ZHEMBED_MEMORY_TRIM_BATCHES": "0"},
    "trim-only": {"ZHEMBED_MMAP_THRESHOLD_KB": "0"},
    "mmap-env": {**OFF, "MALLOC_MMAP_THRESHOLD_": "131072"},
    "arena-off": {"LAB_ARENA_OFF": "1"},
    "arena-shrink": {"LAB_SHRINK_EVERY": "64"},
    "no-ceiling": {"LAB_NO_CEILING": "1"},
    "no-bound": {"ZHEMBED_MAX_BATCH_ATTENTION": "0"},
    "as-before": {"ZHEMBED_MAX_BATCH_ATTENTION": "0", "LAB_NO_CEILING": "1"},
}
# The table's columns after the variant's name (:func:`summary` writes its rows).
COLUMNS = ("ready", "USS 1st", "middle", "end", "max", "growth", "req/s", "batches", "trim ms")


def uss_by_kind() -> dict[str, float]:
    """Private memory in MB by kind of mapping: ``heap`` (glibc's main arena), ``anon`` (mmap'd blocks, other
    threads' arenas, ONNX Runtime's own), ``files`` (libraries, the graphs) and ``other``."""
    kinds: dict[str, float] = {"heap": 0.0, "anon": 0.0, "files": 0.0, "other": 0.0}
    for m in psutil.Process().memory_maps(grouped=True):
        kind = {"[heap]": "heap", "[anon]": "anon"}.get(m.path, "other" if m.path[:1] == "[" else "files")
        kinds[kind] += (m.private_clean + m.private_dirty) / 2**20
    return kinds


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """One variant in this process: the readings as a dict."""
    from app.model import runtime
    from app.settings import Settings
    from app.tasks.options import EmbedOptions
    from loadtest import procs
    from loadtest.corpus import load_corpus, unique_texts
    from loadtest.harness.service import fields, in_process

    if os.environ.get("LAB_ARENA_OFF"):
        plain = runtime.session_options

        def no_arena(provider: str, intra_op_threads: int = 0, sessions: int = 1) -> Any:
            options = plain(provider, intra_op_threads, sessions)
            options.enable_cpu_mem_arena = False
            return options

        runtime.session_options = no_arena
    if every := int(os.environ.get("LAB_SHRINK_EVERY", "0")):
        import onnxruntime as ort

        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        runs = iter(range(1, sys.maxsize))

        def encode(self: Any, input_ids: Any, attention_mask: Any, outputs: Any, types: Any = None) -> Any:
            types = np.zeros_like(input_ids) if types is None else types
            feed = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": types}
            return list(self._encoder.run(outputs, feed, shrink if next(runs) % every == 0 else None))

        runtime.OnnxModel.encode = encode  # type: ignore[method-assign,assignment]
    settings = Settings(**fields(args.model, args.variant, 100_000, intra_op_threads=args.threads))
    service, engine = await in_process(settings)
    if os.environ.get("LAB_NO_CEILING"):
        type(engine.limits).largest = lambda self, max_length: []  # type: ignore[method-assign]
    await service.warmup()  # as a worker does before it accepts
    ready = procs.memory(os.getpid()).uss / procs.MB
    corpus = load_corpus()
    rng = random.Random(0)
    sent = 0
    readings: list[tuple[int, float]] = []
    kinds: list[dict[str, float]] = []
    started = time.perf_counter()

    async def client() -> None:
        nonlocal sent
        while sent < args.requests:
            sent += 1
            texts = unique_texts(corpus, (sent - 1) * args.max_texts, rng.randint(1, args.max_texts))
            # Any mix of lengths: each text repeated or cut to 1 to ``--max-chars`` characters.
            if most := args.max_chars:
                texts = [(t * (most // len(t) + 1))[: rng.randint(1, most)] for t in texts]
            await service.embeddings.embed(texts, EmbedOptions())
            if sent % args.step == 0:
                # USS: what this process alone holds (PSS would move with what its library sharers do).
                readings.append((sent, procs.memory(os.getpid()).uss / procs.MB))
                if len(readings) == 1:
                    kinds.append(uss_by_kind())

    try:
        await asyncio.gather(*(client() for _ in range(args.clients)))
    finally:
        engine.stop()
    kinds.append(uss_by_kind())
    return {
        "growth_by_kind": {k: kinds[-1][k] - kinds[0][k] for k in kinds[0]},
        "readings": readings,
        "ready": ready,
        "seconds": time.perf_counter() - started,
        "batches": engine.batcher.stats.batches,
        "trim_ms": 1000 * engine.scheduler.trimmer.seconds / max(engine.scheduler.trimmer.trims, 1),
    }


def summary(name: str, result: dict[str, Any], requests: int) -> str:
    uss = [mb for _, mb in result["readings"]]
    first, middle, last = uss[0], uss[len(uss) // 2], uss[-1]
    return (
        f"{name:<11}{result['ready']:>9.1f}{first:>9.1f}{middle:>9.1f}{last:>9.1f}{max(uss):>9.1f}"
        f"{(last - first) / first:>+9.1%}{requests / result['seconds']:>9.1f}{result['batches']:>9}"
        f"{result['trim_ms']:>9.2f}  "
        + " ".join(f"{k} {v:+.1f}" for k, v in result["growth_by_kind"].items())
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.memory", __doc__, model=TWIN, out=None)
    p.add_argument("--variant", default="int8")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--step", type=int, default=250)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-texts", type=int, default=8)
    p.add_argument("--max-chars", type=int, default=0, help="1 to N characters a text (0: as in the corpus)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parallel", type=int, default=2, help="variants run at once")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return 0
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    results: dict[str, dict[str, Any]] = {}
    print(
        f"{args.model} ({args.variant}), {args.requests} requests of 1-{args.max_texts} texts, "
        f"{args.clients} clients, {args.threads} thread(s) each, {args.parallel} variant(s) at a time"
    )
    print(f"{'variant':<11}" + "".join(f"{c:>9}" for c in COLUMNS))
    command = [sys.executable, "-m", "loadtest.memory", *argv, "--child"]
    start = partial(subprocess.Popen, command, stdout=subprocess.PIPE, text=True)
    for i in range(0, len(names), args.parallel):
        running = {n: start(env={**os.environ, **VARIANTS[n]}) for n in names[i : i + args.parallel]}
        for n, proc in running.items():
            out, _ = proc.communicate()
            if proc.returncode != 0:
                print(f"{n}: exited {proc.returncode}")
                continue
            results[n] = json.loads(out.strip().splitlines()[-1])
            print(summary(n, results[n], args.requests), flush=True)
    write_json(results, args.out, "memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
