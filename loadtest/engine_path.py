"""CPU per sentence of the service and engine alone, no HTTP: ``Service.embed`` on a real model.

    python -m loadtest.engine_path [--model DIR] [--cells 8x32,64x32,32x1] [--seconds 4] [--gpu-like]

The service and engine built in-process from the tiny model (cache off, one intra-op thread), with
closed-loop clients (:func:`loadtest.loadgen.closed_loop`) sending distinct texts. Columns: cell, sent/s,
batch, us/sent (the whole process's CPU), in run (the inference thread inside ``Session.run``), outside,
and µs per sentence by thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
from contextlib import nullcontext
from pathlib import Path

import uvloop

from app.settings import Settings
from app.tasks.options import EmbedOptions
from app.tasks.service import Service
from app.telemetry.metrics import Metrics
from loadtest import procs
from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness import parser
from loadtest.harness.cell import STRIDE, Cell, parse_cells
from loadtest.harness.service import GPU_LIKE, fields, in_process
from loadtest.loadgen import Answer, closed_loop
from loadtest.quick_model import tiny_model


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid, seconds in procs.thread_cpu_seconds(os.getpid()).items():
        name = names.get(tid, "other")
        out[name] = out.get(name, 0.0) + seconds
    return out


async def cell(service: Service, metrics: Metrics, c: Cell, seconds: float, start: int) -> str:
    """``c``'s closed-loop clients calling ``Service.embed`` for ``seconds`` after a quarter of that (queues
    as deep as they get); CPU and batches read at the window's edges."""
    corpus = load_corpus()
    stats = service.engine.batcher.stats

    async def call(n: int) -> Answer:
        batch = unique_texts(corpus, start + n * c.texts, c.texts)
        await service.embeddings.embed(batch[0] if c.texts == 1 else batch, EmbedOptions())
        return Answer(None, c.texts)

    async def edges() -> list[tuple[dict[str, float], float, int, int]]:
        readings = []
        for wait in (seconds / 4, seconds):
            await asyncio.sleep(wait)
            in_run = float(metrics.inference_cpu._value.get())  # the inference thread inside Session.run
            readings.append((thread_cpu(), in_run, stats.batches, stats.items))
        return readings

    load, ((threads0, r0, b0, i0), (threads1, r1, b1, i1)) = await asyncio.gather(
        closed_loop(lambda: nullcontext(call), c.clients, seconds, seconds / 4), edges()
    )
    cpu, run, batches, items = load.client_cpu_s, r1 - r0, b1 - b0, i1 - i0  # the process: clients and all
    per = 1e6 / max(items, 1)
    per_thread = {k: v - threads0.get(k, 0.0) for k, v in threads1.items()}
    threads = "  ".join(f"{k}: {v * per:.0f}" for k, v in sorted(per_thread.items()) if v * per >= 1)
    return (
        f"{c.clients}x{c.texts:<10}{load.sentences_per_s:>9.0f}{items / max(batches, 1):>7.1f}"
        f"{cpu * per:>9.0f}{run * per:>8.0f}{(cpu - run) * per:>9.0f}  {threads}"
    )


async def run(args: argparse.Namespace, model: Path) -> None:
    settings = Settings(
        **fields(model, "fp32", 100_000, intra_op_threads=1, **(GPU_LIKE if args.gpu_like else {}))
    )
    service, engine = await in_process(settings)
    print(f"engine path: {model}, {'GPU-like' if args.gpu_like else 'CPU default'} batches, cache off")
    print(
        f"{'cell':<14}{'sent/s':>9}{'batch':>7}{'us/sent':>9}{'in run':>8}{'outside':>9}  us/sent by thread"
    )
    try:
        for k, c in enumerate(parse_cells(args.cells)):
            print(await cell(service, engine.metrics, c, args.seconds, STRIDE * (k + 1)), flush=True)
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.engine_path", __doc__)
    p.add_argument("--model", type=Path, default=None, help="export folder (reused, or exported into)")
    p.add_argument("--cells", default="8x32,64x32,32x1", help="clients x texts per request")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--gpu-like", action="store_true", help="the batch settings a GPU gets")
    args = p.parse_args(argv)
    with tiny_model(args.model) as model:
        uvloop.run(run(args, model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
