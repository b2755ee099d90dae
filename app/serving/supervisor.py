"""Several worker processes behind one port: ``python -m app --workers N`` (``ZHEMBED_WORKERS``). This
process, the supervisor, opens the socket, starts the workers, forwards signals to them, replaces one
that crashes and, with ``worker_max_memory_mb`` set, one whose memory passes that bound; what the workers
share (one admission budget, ready and serving flags, one /metrics) is :mod:`app.serving.cluster`.

Design: N whole services, each with its own ONNX Runtime session, tokeniser, batcher and event loop,
accepting from ONE listening socket that the supervisor (this process) opens and hands to each. Why not
HTTP workers feeding one inference process: the work a GPU waits on is the Python around each batch
(HTTP, validation, tokenising, pooling, JSON), and that only runs in parallel in separate processes;
handing tokens and pooled vectors between processes would add a copy and a hop per request, while one
more session costs only its weights on the device (the fp16 graph is 204 MB; an H200 has 139 GiB) and
ONNX Runtime runs sessions of several processes on one GPU concurrently (docs/performance.md has what
1, 2 and 4 processes serve).

What the supervisor keeps, with N > 1 as with one process:

- **SIGTERM drains with nothing lost**: the supervisor closes its own copy of the listening socket and
  forwards the signal once to every worker, which drains as a single process does (:mod:`app.serving.server`);
  workers run in their own process group, so a terminal's Ctrl-C reaches them only through it.
- **A bound per worker, never fewer workers serving** (``worker_max_memory_mb``; with it set, one worker
  runs under a supervisor too): every ``MEMORY_CHECK_S`` the supervisor reads each worker's memory (PSS,
  :mod:`app.serving.memory`; it costs the workers nothing, busy or not). A serving worker past the bound is
  logged (a warning: its index, pid, MB and the bound) and its replacement starts in the spare slot while
  it goes on serving; once the replacement is ready the supervisor marks it serving, the old one not, and
  sends the old one SIGUSR1: it retires (closes its listener, serves the connections it holds, each
  closed after its response, exits 0 when none is left: :mod:`app.serving.server`), and its slot becomes
  the spare. One replacement at a time: the pod's memory must hold one worker more, not N more.
  ``zhembed_worker_replacements_total{reason="memory"}`` counts them (the replacement counts itself
  once ready: a supervisor cannot write prometheus-client's multiprocess files, a dead worker's counters
  stay in them), ``zhembed_worker_memory_bytes`` shows what was measured.

A worker that exits on its own (a crash, or exit status 1 once it cannot serve: its warm-up failed or its
inference thread died, :mod:`app.serving.server`) is replaced in its slot (``reason="crash"``), and the
replacement of a worker past the bound that crashes while starting is started again; but the
``EARLY_DEATHS``-th worker in a row to die before it was ready (or within ``MIN_UPTIME_S`` of its start)
stops the server, exit status 1 (:mod:`app.serving.slots`). The supervisor exits 0 when every serving
worker did.
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

from app.model.manifest import ManifestError
from app.model.runtime import CUDA, load_models
from app.serving.cluster import Cluster, Shared, first_provider
from app.serving.factory import create_app
from app.serving.server import http_server
from app.serving.slots import MB, Slots
from app.settings import Settings
from app.telemetry import logs

log = logging.getLogger("app")

# prometheus-client reads this variable when it is imported: it must be set before a worker starts.
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
PR_SET_PDEATHSIG = 1  # prctl(2)


def serve(settings: Settings, count: int) -> int:
    """Run ``count`` workers on one listening socket until SIGTERM or SIGINT; the exit status.

    ``settings.model`` (or each of ``settings.models``) must already name an exported, verified model
    folder (``check_models``).
    """
    ctx = mp.get_context("spawn")
    listener = socket.create_server((settings.host, settings.port), backlog=2048, reuse_port=False)
    metrics_dir = tempfile.mkdtemp(prefix="zhembed-metrics-")
    os.environ[METRICS_DIR_VARIABLE] = metrics_dir  # inherited by every worker at spawn
    spares = 1 if settings.worker_max_memory_mb else 0  # where a replacement starts beside the old worker
    shared = Shared.create(ctx, count + spares, count, metrics_dir, len(settings.model_entries()))
    settings = _per_worker(settings, count)
    signals: list[int] = []

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        signals.append(sig)  # handled in the loop below, not in the handler

    def start(index: int, replacing: str | None) -> BaseProcess:
        proc: BaseProcess = ctx.Process(
            target=_worker,
            args=(settings, listener, index, shared, os.getpid(), replacing),
            name=f"zhembed-worker-{index}",
        )
        proc.start()
        return proc

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    slots = Slots(
        count,
        shared,
        start,
        bound_bytes=settings.worker_max_memory_mb * MB,
        retire_s=settings.shutdown_grace_s,
    )
    log.info(
        "%d workers on %s:%d%s",
        count,
        settings.host,
        settings.port,
        f", each bounded to {settings.worker_max_memory_mb} MB" if settings.worker_max_memory_mb else "",
    )
    forwarded = 0
    try:
        # Until every worker has exited and, unless the server is stopping, each exit was handled: workers
        # whose starts all fail may all be gone before the first step sees them.
        while slots.alive() or (not signals and slots.unhandled()):
            while forwarded < len(signals):
                sig = signals[forwarded]
                if forwarded == 0:
                    listener.close()  # the workers keep their copies open for the drain
                slots.signal_all(sig)
                forwarded += 1
            if not signals and not slots.step():
                signals.append(signal.SIGTERM)
            slots.reap_stopping()
            time.sleep(0.1)
    finally:
        listener.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    log.info("stopped")
    return 1 if slots.failed or not slots.exited_cleanly() else 0


def _per_worker(settings: Settings, count: int) -> Settings:
    """Settings for each of ``count`` workers: on CPU, unless set, ONNX Runtime's threads split the cores
    among them (each session would otherwise start a thread per core, and they would contend)."""
    if settings.intra_op_threads or first_provider(settings) == CUDA:
        return settings
    return settings.model_copy(update={"intra_op_threads": max(1, (os.cpu_count() or 1) // count)})


def _die_with(supervisor: int) -> None:
    """Have the kernel send SIGTERM (a drain) to this worker if the supervisor dies, even by SIGKILL, so
    no worker is left serving on its own (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _worker(
    settings: Settings,
    listener: socket.socket,
    index: int,
    shared: Shared,
    supervisor: int,
    replacing: str | None,
) -> None:
    """One worker process: load the model, serve on the shared socket, drain on the forwarded signal,
    retire on SIGUSR1."""
    # Until the server handles them (a drain), a stop asked for while the model loads ends the worker
    # with status 0 once the load is over, rather than killing it by the signal's default action.
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
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
        models = None if stop else load_models(settings)
    except ManifestError as exc:
        print(f"zhembed worker {index}: cannot start: {exc}", file=sys.stderr)
        sys.exit(2)
    if stop or models is None:
        log.info("stopped (signal %d) while starting", stop[0])
        return
    app = create_app(settings, cluster=Cluster(shared, index, replacing), models=models)
    server = http_server(app, settings)
    server.run(sockets=[listener])
    if server.exit_status:  # a fault, or a start that failed: the supervisor starts another in its slot
        sys.exit(server.exit_status)
