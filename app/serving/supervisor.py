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
ONNX Runtime runs sessions of several processes on one GPU concurrently. Measured before this change on
an H200: 1 / 2 / 4 separate processes served 2,560 / 4,333 / 7,136 sentences/s (issue 13).

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

A worker that exits on its own (a crash) is replaced in its slot (``reason="crash"``), and the
replacement of a worker past the bound that crashes while starting is started again; a worker that dies
within ``MIN_UPTIME_S`` of its start stops the server instead. The supervisor exits 0 when every
serving worker did.
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
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Protocol

from app.model.manifest import ManifestError
from app.model.runtime import CUDA, load_model
from app.serving.cluster import Cluster, Shared, first_provider
from app.serving.factory import create_app
from app.serving.memory import memory_bytes
from app.serving.server import http_server
from app.settings import Settings
from app.telemetry import logs

log = logging.getLogger("app")

# prometheus-client reads this variable when it is imported: it must be set before a worker starts.
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# A worker that dies sooner than this after its start is not replaced (it would only die again: a model
# it cannot load, a port it cannot use); the server stops instead.
MIN_UPTIME_S = 10.0
# How often each worker's memory is read: a few reads of /proc per worker, and memory grows over minutes.
MEMORY_CHECK_S = 2.0
MB = 1024 * 1024
PR_SET_PDEATHSIG = 1  # prctl(2)
RETIRE_SIGNAL = signal.SIGUSR1


def serve(settings: Settings, count: int) -> int:
    """Run ``count`` workers on one listening socket until SIGTERM or SIGINT; the exit status.

    ``settings.model`` must already name an exported, verified model folder (``check_model``).
    """
    ctx = mp.get_context("spawn")
    listener = socket.create_server((settings.host, settings.port), backlog=2048, reuse_port=False)
    metrics_dir = tempfile.mkdtemp(prefix="zhembed-metrics-")
    os.environ[METRICS_DIR_VARIABLE] = metrics_dir  # inherited by every worker at spawn
    spares = 1 if settings.worker_max_memory_mb else 0  # where a replacement starts beside the old worker
    shared = Shared.create(ctx, count + spares, count, metrics_dir)
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
        while slots.alive():
            while forwarded < len(signals):
                sig = signals[forwarded]
                if forwarded == 0:
                    listener.close()  # the workers keep their copies open for the drain
                slots.signal_all(sig)
                forwarded += 1
            if not signals and not slots.step():
                signals.append(signal.SIGTERM)
            time.sleep(0.1)
    finally:
        listener.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    log.info("stopped")
    return 1 if slots.failed or not slots.exited_cleanly() else 0


class Proc(Protocol):
    """What :class:`Slots` uses of a worker process (``multiprocessing``'s, or a test's)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...


@dataclass
class Slot:
    """A worker process in one slot of :class:`Shared`."""

    proc: Proc
    started: float
    replacing: str | None  # why it was started in place of another; None for one of the first
    replaces: int | None = None  # the slot of the worker it will take over from once ready (memory)
    retiring_since: float | None = None  # when it was told to retire


class Slots:
    """The supervisor's decisions, one :meth:`step` at a time: replace a worker that crashed, read memory,
    start the replacement of a worker past the bound, retire that worker once its replacement is ready
    (the module docstring). Processes, memory readings and the clock come from outside, so tests can hand
    it fakes.

    Args:
        count: the workers that serve; :class:`Shared` holds their slots and any spare after them.
        start: starts a worker in a slot, with why it replaces another (None: one of the first).
        bound_bytes: the memory bound per worker; 0 = none.
        retire_s: how long a retiring worker may wait for its connections (``shutdown_grace_s``).
    """

    def __init__(
        self,
        count: int,
        shared: Shared,
        start: Callable[[int, str | None], Proc],
        *,
        bound_bytes: int = 0,
        retire_s: float = 25.0,
        memory: Callable[[int], int | None] = memory_bytes,
        kill: Callable[[int, int], None] = os.kill,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self._start = start
        self.bound_bytes = bound_bytes
        # Its wait for connections, then uvicorn's graceful shutdown (shorter than that) and the lifespan's:
        # past this a retiring worker is stuck, and is killed so that its slot is free again.
        self.retire_kill_s = 2 * retire_s + 10
        self._memory = memory
        self._kill = kill
        self._clock = clock
        self.failed = False
        self._forwarded: set[int] = set()  # the stop signals sent to every worker
        now = clock()
        self.slots: list[Slot | None] = [Slot(start(i, None), now, None) for i in range(count)]
        self.slots += [None] * (len(shared.ready) - count)
        self._next_check = now + MEMORY_CHECK_S

    def alive(self) -> bool:
        return any(s is not None and s.proc.is_alive() for s in self.slots)

    def signal_all(self, sig: int) -> None:
        self._forwarded.add(sig)
        for slot in self.slots:
            if slot is not None and slot.proc.is_alive() and slot.proc.pid is not None:
                self._kill(slot.proc.pid, sig)

    def exited_cleanly(self) -> bool:
        """Every serving worker exited 0 (a replacement stopped while starting does not count), or died by
        a stop this supervisor forwarded: one that serves drains and exits 0, so a worker the signal
        killed was still starting (importing, before its handlers), and held nothing."""
        return all(
            (code := s.proc.exitcode) == 0 or (code is not None and -code in self._forwarded)
            for i, s in enumerate(self.slots)
            if s is not None and self.shared.serving[i]
        )

    def step(self) -> bool:
        """One round of decisions; False when a worker died right after its start (the server stops)."""
        now = self._clock()
        for index, slot in enumerate(self.slots):
            if slot is not None and not slot.proc.is_alive() and not self._exited(index, slot, now):
                self.failed = True
                return False
        for index, slot in enumerate(self.slots):
            if slot is None:
                continue
            if slot.replaces is not None and self.shared.ready[index]:
                self._take_over(index, slot, now)
            elif slot.retiring_since is not None and now - slot.retiring_since > self.retire_kill_s:
                self._kill_stuck(index, slot, now)
        if now >= self._next_check:
            self._next_check = now + MEMORY_CHECK_S
            self._check_memory()
        return True

    def _exited(self, index: int, slot: Slot, now: float) -> bool:
        """Handle the exit of ``slot``'s worker; False when it died right after its start."""
        proc = slot.proc
        if slot.retiring_since is not None:
            log.info("worker %d (pid %s) retired, exit status %s", index, proc.pid, proc.exitcode)
            self._forget(index, proc)
            self.slots[index] = None
            return True
        if now - slot.started < MIN_UPTIME_S:
            log.error("worker %d exited with %s right after its start; stopping", index, proc.exitcode)
            return False
        self._forget(index, proc)
        successor = next((i for i, s in enumerate(self.slots) if s is not None and s.replaces == index), None)
        if successor is not None:  # its replacement is already starting: it serves in its place once ready
            log.error(
                "worker %d (pid %s) exited with %s; worker %d, starting to replace it, takes its place",
                index,
                proc.pid,
                proc.exitcode,
                successor,
            )
            self.slots[index] = None
            self.shared.serving[successor] = 1
            self.shared.serving[index] = 0
            successor_slot = self.slots[successor]
            assert successor_slot is not None
            successor_slot.replaces = None
            return True
        log.error("worker %d (pid %s) exited with %s; starting another", index, proc.pid, proc.exitcode)
        reason = slot.replacing if slot.replaces is not None else "crash"  # a replacement starts again
        self.slots[index] = Slot(self._start(index, reason), now, reason, replaces=slot.replaces)
        return True

    def _take_over(self, index: int, slot: Slot, now: float) -> None:
        """``slot``'s worker is ready: it serves, and the worker it replaces retires."""
        old_index = slot.replaces
        assert old_index is not None
        old = self.slots[old_index]
        assert old is not None
        slot.replaces = None
        self.shared.serving[index] = 1  # first: /ready counts only serving slots, and this one is ready
        self.shared.serving[old_index] = 0
        old.retiring_since = now
        log.info(
            "worker %d (pid %s) is ready; worker %d (pid %s) retires",
            index,
            slot.proc.pid,
            old_index,
            old.proc.pid,
        )
        if old.proc.pid is not None:
            self._kill(old.proc.pid, RETIRE_SIGNAL)

    def _kill_stuck(self, index: int, slot: Slot, now: float) -> None:
        if slot.proc.pid is not None and slot.proc.is_alive():
            assert slot.retiring_since is not None
            waited = now - slot.retiring_since
            log.error(
                "worker %d (pid %s) is still retiring after %.0f s; killing it", index, slot.proc.pid, waited
            )
            self._kill(slot.proc.pid, signal.SIGKILL)

    def _check_memory(self) -> None:
        starting = any(s is not None and s.replaces is not None for s in self.slots)
        for index, slot in enumerate(self.slots):
            if slot is None or slot.proc.pid is None or not slot.proc.is_alive():
                continue
            measured = self._memory(slot.proc.pid)
            if measured is None:
                continue
            self.shared.memory[index] = measured
            if (
                self.bound_bytes
                and measured > self.bound_bytes
                and not starting
                and slot.retiring_since is None
                and self.shared.serving[index]
                and self.shared.ready[index]
            ):
                free = next((i for i, s in enumerate(self.slots) if s is None), None)
                if free is None:  # the worker last replaced has not exited yet
                    continue
                log.warning(
                    "worker %d (pid %d) uses %.0f MB, past the bound of %d MB (worker-max-memory-mb); "
                    "starting worker %d to replace it",
                    index,
                    slot.proc.pid,
                    measured / MB,
                    self.bound_bytes // MB,
                    free,
                )
                self.slots[free] = Slot(self._start(free, "memory"), self._clock(), "memory", replaces=index)
                starting = True

    def _forget(self, index: int, proc: Proc) -> None:
        _forget(self.shared, index, proc)


def _per_worker(settings: Settings, count: int) -> Settings:
    """Settings for each of ``count`` workers: on CPU, unless set, ONNX Runtime's threads split the cores
    among them (each session would otherwise start a thread per core, and they would contend)."""
    if settings.intra_op_threads or first_provider(settings) == CUDA:
        return settings
    return settings.model_copy(update={"intra_op_threads": max(1, (os.cpu_count() or 1) // count)})


def _forget(shared: Shared, index: int, proc: Proc) -> None:
    """Clear what a dead worker held: its permits, its ready flag, its memory, its live metrics."""
    with shared.permits.get_lock():
        shared.permits[index] = 0
    shared.ready[index] = 0
    shared.memory[index] = 0
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
        model = None if stop else load_model(settings)
    except ManifestError as exc:
        print(f"zhembed worker {index}: cannot start: {exc}", file=sys.stderr)
        sys.exit(2)
    if stop or model is None:
        log.info("stopped (signal %d) while starting", stop[0])
        return
    app = create_app(settings, model, Cluster(shared, index, replacing))
    http_server(app, settings).run(sockets=[listener])
