"""Several worker processes behind one port: ``python -m app --workers N`` (``ZHEMBED_WORKERS``). This
process, the supervisor, opens the socket, starts the workers, forwards signals to them and replaces one
that crashes; what the workers share (one admission budget, ready flags, one /metrics) is
:mod:`app.serving.cluster`.

Design: N whole services, each with its own ONNX Runtime session, tokeniser, batcher and event loop,
accepting from ONE listening socket that the supervisor (this process) opens and hands to each. Why not
HTTP workers feeding one inference process: the work a GPU waits on is the Python around each batch
(HTTP, validation, tokenising, pooling, JSON), and that only runs in parallel in separate processes;
handing tokens and pooled vectors between processes would add a copy and a hop per request, while one
more session costs only its weights on the device (the fp16 graph is 204 MB; an H200 has 139 GiB) and
ONNX Runtime runs sessions of several processes on one GPU concurrently. Measured before this change on
an H200: 1 / 2 / 4 separate processes served 2,560 / 4,333 / 7,136 sentences/s (issue 13).

What the supervisor keeps, with N > 1 as with one process:

- **SIGTERM drains with nothing lost**: the supervisor closes its own copy of the listening socket and
  forwards the signal once to every worker, which drains as a single process does (:mod:`app.serving.server`);
  workers run in their own process group, so a terminal's Ctrl-C reaches them only through it.

A worker that exits on its own (a crash) is replaced; the supervisor exits 0 when every worker did.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from app.model.manifest import ManifestError
from app.model.runtime import CUDA, load_model
from app.serving.cluster import Cluster, Shared, first_provider
from app.serving.factory import create_app
from app.serving.server import http_server
from app.settings import Settings
from app.telemetry import logs

log = logging.getLogger("app")

# prometheus-client reads this variable when it is imported: it must be set before a worker starts.
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# A worker that dies sooner than this after its start is not replaced (it would only die again: a model
# it cannot load, a port it cannot use); the server stops instead.
MIN_UPTIME_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2)


def serve(settings: Settings, count: int) -> int:
    """Run ``count`` workers on one listening socket until SIGTERM or SIGINT; the exit status.

    ``settings.model`` must already name an exported, verified model folder (``check_model``).
    """
    ctx = mp.get_context("spawn")
    listener = socket.create_server((settings.host, settings.port), backlog=2048, reuse_port=False)
    metrics_dir = tempfile.mkdtemp(prefix="zhembed-metrics-")
    os.environ[METRICS_DIR_VARIABLE] = metrics_dir  # inherited by every worker at spawn
    shared = Shared(ctx.Array("q", count), ctx.Array("b", count), metrics_dir)
    settings = _per_worker(settings, count)
    signals: list[int] = []

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        signals.append(sig)  # handled in the loop below, not in the handler

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    procs = [_start(ctx, settings, listener, i, shared) for i in range(count)]
    log.info("%d workers on %s:%d", count, settings.host, settings.port)
    forwarded = 0
    failed = False
    try:
        while any(p.is_alive() for p, _ in procs):
            while forwarded < len(signals):
                sig = signals[forwarded]
                if forwarded == 0:
                    listener.close()  # the workers keep their copies open for the drain
                for p, _ in procs:
                    if p.is_alive() and p.pid is not None:
                        os.kill(p.pid, sig)
                forwarded += 1
            if not signals:
                for i, (p, started) in enumerate(procs):
                    if p.is_alive():
                        continue
                    if time.monotonic() - started < MIN_UPTIME_S:
                        log.error("worker %d exited with %s right after its start; stopping", i, p.exitcode)
                        failed = True
                        signals.append(signal.SIGTERM)
                        break
                    log.error("worker %d (pid %s) exited with %s; starting another", i, p.pid, p.exitcode)
                    _forget(shared, i, p)
                    procs[i] = _start(ctx, settings, listener, i, shared)
            time.sleep(0.1)
    finally:
        listener.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    log.info("stopped")
    return 1 if failed or any(p.exitcode != 0 for p, _ in procs) else 0


def _per_worker(settings: Settings, count: int) -> Settings:
    """Settings for each of ``count`` workers: on CPU, unless set, ONNX Runtime's threads split the cores
    among them (each session would otherwise start a thread per core, and they would contend)."""
    if settings.intra_op_threads or first_provider(settings) == CUDA:
        return settings
    return settings.model_copy(update={"intra_op_threads": max(1, (os.cpu_count() or 1) // count)})


def _start(
    ctx: Any, settings: Settings, listener: socket.socket, index: int, shared: Shared
) -> tuple[BaseProcess, float]:
    proc: BaseProcess = ctx.Process(
        target=_worker, args=(settings, listener, index, shared, os.getpid()), name=f"zhembed-worker-{index}"
    )
    proc.start()
    return proc, time.monotonic()


def _forget(shared: Shared, index: int, proc: BaseProcess) -> None:
    """Clear what a dead worker held: its permits, its ready flag, its live metrics."""
    with shared.permits.get_lock():
        shared.permits[index] = 0
    shared.ready[index] = 0
    if proc.pid is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(proc.pid, shared.metrics_dir)


def _die_with(supervisor: int) -> None:
    """Have the kernel send SIGTERM (a drain) to this worker if the supervisor dies, even by SIGKILL, so
    no worker is left serving on its own (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _worker(settings: Settings, listener: socket.socket, index: int, shared: Shared, supervisor: int) -> None:
    """One worker process: load the model, serve on the shared socket, drain on the forwarded signal."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor, which forwards it once
    _die_with(supervisor)
    logs.configure(
        settings.log_format,
        settings.log_level.upper(),
        text_format=f"%(asctime)s %(levelname)s %(name)s[worker {index}]: %(message)s",
        static={"worker": index},
    )
    try:
        model = load_model(settings)
    except ManifestError as exc:
        print(f"zhembed worker {index}: cannot start: {exc}", file=sys.stderr)
        sys.exit(2)
    app = create_app(settings, model, Cluster(shared, index))
    http_server(app, settings).run(sockets=[listener])
