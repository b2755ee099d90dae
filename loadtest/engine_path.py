"""CPU per sentence of the service and engine alone, no HTTP: ``Service.embed`` on a real model (issue 19).

    python -m loadtest.engine_path [--model DIR] [--cells 8x32,64x32,32x1] [--seconds 4] [--gpu-like]

The service and engine built in-process from the tiny model (cache off, one intra-op thread), with
closed-loop asyncio clients sending distinct texts. Columns: cell, sent/s, batch, us/sent (the whole
process's CPU), in run (the inference thread inside ``Session.run``), outside, and µs per sentence by thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from pathlib import Path

import uvloop

from app.settings import Settings
from app.tasks.options import EmbedOptions
from app.tasks.service import Service
from app.telemetry.metrics import Metrics
from loadtest import procs
from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness.cell import STRIDE, parse_cells
from loadtest.harness.service import GPU_LIKE, fields, in_process
from loadtest.quick_model import tiny_model


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid, seconds in procs.thread_cpu_seconds(os.getpid()).items():
        name = names.get(tid, "other")
        out[name] = out.get(name, 0.0) + seconds
    return out


def cpu_in_run(metrics: Metrics) -> float:
    return float(metrics.inference_cpu._value.get())


async def cell(
    service: Service, metrics: Metrics, clients: int, texts: int, seconds: float, start: int
) -> str:
    corpus = load_corpus()
    counter = iter(range(start, start + 10_000_000, texts))
    done = 0
    stop = False
    per_thread: dict[str, float] = {}

    async def client() -> None:
        nonlocal done
        while not stop:
            batch = unique_texts(corpus, next(counter), texts)
            await service.embeddings.embed(batch[0] if texts == 1 else batch, EmbedOptions())
            done += texts

    async def measured() -> tuple[int, float, float, float, int, int]:
        await asyncio.sleep(seconds / 4)  # warm: queues as deep as they get
        threads0 = thread_cpu()
        d0, c0, r0, t0 = done, time.process_time(), cpu_in_run(metrics), time.perf_counter()
        b0, i0 = service.engine.batcher.stats.batches, service.engine.batcher.stats.items
        await asyncio.sleep(seconds)
        d1, c1, r1, t1 = done, time.process_time(), cpu_in_run(metrics), time.perf_counter()
        b1, i1 = service.engine.batcher.stats.batches, service.engine.batcher.stats.items
        threads1 = thread_cpu()
        per_thread.update({k: v - threads0.get(k, 0.0) for k, v in threads1.items()})
        return d1 - d0, c1 - c0, r1 - r0, t1 - t0, b1 - b0, i1 - i0

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    sentences, cpu, run, wall, batches, items = await measured()
    stop = True
    await asyncio.gather(*tasks)
    per = 1e6 / max(items, 1)
    threads = "  ".join(f"{k}: {v * per:.0f}" for k, v in sorted(per_thread.items()) if v * per >= 1)
    return (
        f"{clients}x{texts:<10}{sentences / wall:>9.0f}{items / max(batches, 1):>7.1f}"
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
            print(
                await cell(service, engine.metrics, c.clients, c.texts, args.seconds, STRIDE * (k + 1)),
                flush=True,
            )
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.engine_path", description=__doc__)
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
