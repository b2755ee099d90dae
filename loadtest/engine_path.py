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
from prometheus_client import generate_latest

from app.settings import Settings
from app.tasks.options import EmbedOptions
from app.tasks.service import Service
from app.telemetry.metrics import Metrics
from loadtest import procs
from loadtest.corpus import load_corpus, unique_texts
from loadtest.harness import parser
from loadtest.harness.cell import STRIDE, Cell, parse_cells
from loadtest.harness.measure import Measured
from loadtest.harness.report import Column, Row, Table
from loadtest.harness.service import GPU_LIKE, fields, in_process
from loadtest.loadgen import Answer, closed_loop
from loadtest.quick_model import tiny_model
from loadtest.server import parse_exposition

RATE = Column("sent/s", 9, ".0f", "sentences_per_s")
TABLE = Table("cell", 14, RATE, "batch", "us/sent", "in run", "outside", tail="us/sent by thread")


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
    as deep as they get); each thread's CPU and the metrics read at the window's edges."""
    corpus = load_corpus()

    async def call(n: int) -> Answer:
        batch = unique_texts(corpus, start + n * c.texts, c.texts)
        await service.embeddings.embed(batch[0] if c.texts == 1 else batch, EmbedOptions())
        return Answer(None, c.texts)

    async def edges() -> list[tuple[dict[str, float], dict[str, float]]]:
        readings = []
        for wait in (seconds / 4, seconds):
            await asyncio.sleep(wait)
            readings.append((thread_cpu(), parse_exposition(generate_latest(metrics.registry).decode())))
        return readings

    load, ((threads0, before), (threads1, after)) = await asyncio.gather(
        closed_loop(lambda: nullcontext(call), c.clients, seconds, seconds / 4), edges()
    )
    row = Row.of(Measured(c, load, load.client_cpu_s, seconds, before, after))  # the process: clients and all
    by_thread = {k: row.per_sentence(v - threads0.get(k, 0.0)) for k, v in sorted(threads1.items())}
    return TABLE.row(row, "  ".join(f"{k}: {us:.0f}" for k, us in by_thread.items() if us >= 1))


async def run(args: argparse.Namespace, model: Path) -> None:
    settings = Settings(
        **fields(model, "fp32", 100_000, intra_op_threads=1, **(GPU_LIKE if args.gpu_like else {}))
    )
    service, engine = await in_process(settings)
    print(f"engine path: {model}, {'GPU-like' if args.gpu_like else 'CPU default'} batches, cache off")
    print(TABLE.header)
    try:
        for k, c in enumerate(parse_cells(args.cells)):
            print(await cell(service, engine.metrics, c, args.seconds, STRIDE * (k + 1)), flush=True)
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.engine_path", __doc__, model=None, seconds=4.0)
    p.add_argument("--cells", default="8x32,64x32,32x1", help="clients x texts per request")
    p.add_argument("--gpu-like", action="store_true", help="the batch settings a GPU gets")
    args = p.parse_args(argv)
    with tiny_model(args.model) as model:
        uvloop.run(run(args, model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
