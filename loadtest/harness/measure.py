"""One measured cell: the service's /metrics and CPU time right before and right after closed-loop load
from :mod:`loadtest.loadgen`, so the server's figures cover the whole cell (warm-up, window and drain)."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvloop

from loadtest import loadgen, procs
from loadtest.harness.cell import Cell, answered_vectors
from loadtest.server import HOST, ServiceProcess

INFERENCE_SUM = "zhembed_inference_duration_seconds_sum"
# CPU of the inference thread inside Session.run (the duration also counts the wait for the interpreter
# lock after each run, which is not CPU).
INFERENCE_CPU = "zhembed_inference_cpu_seconds_total"
BATCH_SUM = "zhembed_batch_size_sum"
BATCH_COUNT = "zhembed_batch_size_count"
# The gauge read after each cell: how many workers served it.
WORKERS_READY = "zhembed_workers_ready"


@dataclass
class Measured:
    """What one cell gave: the client's result, and the server's CPU, wall time and /metrics over it."""

    cell: Cell
    load: loadgen.CellResult
    server_cpu_s: float
    wall_s: float
    before: dict[str, float]
    after: dict[str, float]

    def delta(self, name: str) -> float:
        return self.after.get(name, 0.0) - self.before.get(name, 0.0)

    @property
    def computed(self) -> float:
        """Inputs the service ran through the encoder during the whole cell."""
        return self.delta(BATCH_SUM)

    @property
    def mean_batch(self) -> float:
        batches = self.delta(BATCH_COUNT)
        return self.computed / batches if batches else float("nan")

    @property
    def run_cpu_s(self) -> float:
        """CPU inside ``Session.run`` (its wall time for a service that predates the CPU counter)."""
        return self.delta(INFERENCE_CPU if INFERENCE_CPU in self.after else INFERENCE_SUM)


def scrape(svc: ServiceProcess) -> dict[str, float]:
    """``/metrics`` now.

    Raises:
        RuntimeError: it has no inference duration or batch size.
    """
    series = svc.metrics()
    if INFERENCE_SUM not in series or BATCH_SUM not in series:
        raise RuntimeError(f"/metrics has no {INFERENCE_SUM} / {BATCH_SUM}")
    return series


def measure(
    svc: ServiceProcess,
    cell: Cell,
    bodies: loadgen.BodyFactory,
    seconds: float,
    warmup: float,
    check: Callable[[bytes, int], bool] | None = answered_vectors,
    metrics: bool = True,
    drive: Callable[[float, float], Coroutine[Any, Any, loadgen.CellResult]] | None = None,
) -> Measured:
    """``cell``'s load on ``svc`` for ``warmup + seconds``; /metrics (when ``metrics``) and the server's
    CPU time are read right before and right after it. ``drive(seconds, warmup)`` is a load over another
    protocol than HTTP (``bodies`` and ``check`` then go unused)."""
    before = scrape(svc) if metrics else {}
    cpu0, t0 = procs.tree_cpu_seconds(svc.pid), time.perf_counter()
    http = partial(loadgen.run_cell, HOST, svc.port, cell.route, bodies, cell.clients, seconds, warmup)
    load = uvloop.run(drive(seconds, warmup) if drive else http(check=check, headers=cell.headers))
    cpu1, t1 = procs.tree_cpu_seconds(svc.pid), time.perf_counter()
    return Measured(cell, load, cpu1 - cpu0, t1 - t0, before, scrape(svc) if metrics else {})
