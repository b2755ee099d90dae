"""The supervisor's decisions about its worker slots, one step at a time: replace a worker that crashed,
read each worker's memory, start the replacement of one past the bound, retire it once the replacement
is ready (:mod:`app.serving.supervisor` runs the processes and the loop; its docstring says why)."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.serving.cluster import Shared
from app.serving.memory import memory_bytes

log = logging.getLogger("app")

# A worker that dies before it was ever ready (e.g. its warm-up failed), or sooner than this after its
# start, died starting. It is started again, since the cause may have passed (the OOM killer, an operator's
# kill -9), but not for ever: the server stops at the EARLY_DEATHS-th such death with no worker ready in
# between (a model it cannot load or run, a port it cannot use), however long each took to die.
MIN_UPTIME_S = 10.0
EARLY_DEATHS = 3
# How often each worker's memory is read: a few reads of /proc per worker, and memory grows over minutes.
MEMORY_CHECK_S = 2.0
MB = 1024 * 1024
RETIRE_SIGNAL = signal.SIGUSR1


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
    was_ready: bool = False  # its ready flag was seen set: it did not die starting


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
        # A worker told to stop drains, waits for its requests and stops its engine within ``retire_s``;
        # one still alive past this is stuck, and is killed so that the server's own exit is not held up.
        self.stop_kill_s = retire_s + 15
        self._stopped_at: float | None = None
        self._early_deaths: list[float] = []  # when each worker that died starting died, since one got ready
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

    def unhandled(self) -> bool:
        """A worker has exited and :meth:`step` has not yet replaced it or given up (every worker may die
        between two steps: each start failing at once)."""
        return any(s is not None and not s.proc.is_alive() for s in self.slots)

    def signal_all(self, sig: int) -> None:
        self._forwarded.add(sig)
        if self._stopped_at is None:
            self._stopped_at = self._clock()
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

    def reap_stopping(self) -> None:
        """After a stop was forwarded: kill every worker still alive ``stop_kill_s`` later (it is stuck)."""
        if self._stopped_at is None or self._clock() - self._stopped_at <= self.stop_kill_s:
            return
        for index, slot in enumerate(self.slots):
            if slot is not None and slot.proc.is_alive() and slot.proc.pid is not None:
                log.error(
                    "worker %d (pid %s) is still stopping after %.0f s; killing it",
                    index,
                    slot.proc.pid,
                    self.stop_kill_s,
                )
                self._kill(slot.proc.pid, signal.SIGKILL)
        self._stopped_at = None  # once

    def step(self) -> bool:
        """One round of decisions; False when a worker died right after its start (the server stops)."""
        now = self._clock()
        if self._early_deaths and any(
            s is not None and s.started >= self._early_deaths[-1] and self.shared.ready[i]
            for i, s in enumerate(self.slots)
        ):
            self._early_deaths.clear()  # a worker started since got ready: whatever it was has passed
        for index, slot in enumerate(self.slots):
            if slot is None:
                continue
            slot.was_ready = slot.was_ready or bool(self.shared.ready[index])
            if not slot.proc.is_alive() and not self._exited(index, slot, now):
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
        if not slot.was_ready or now - slot.started < MIN_UPTIME_S:
            self._early_deaths.append(now)
            if len(self._early_deaths) >= EARLY_DEATHS:
                log.error(
                    "worker %d exited with %s right after its start, the %d-th to with none ready since; "
                    "stopping",
                    index,
                    proc.exitcode,
                    len(self._early_deaths),
                )
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
        # (bytes, -started, -slot) of the serving workers past the bound: max() picks the most memory,
        # then the oldest, then the lowest slot
        past: list[tuple[int, float, int]] = []
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
                and slot.retiring_since is None
                and self.shared.serving[index]
                and self.shared.ready[index]
            ):
                past.append((measured, -slot.started, -index))
        free = next((i for i, s in enumerate(self.slots) if s is None), None)
        starting = any(s is not None and s.replaces is not None for s in self.slots)
        if not past or starting or free is None:  # one at a time; no slot free until the last one exits
            return
        measured, _, last = max(past)  # the most memory first, then the oldest: none waits for ever
        index = -last
        old = self.slots[index]
        assert old is not None
        log.warning(
            "worker %d (pid %s) uses %.0f MB, past the bound of %d MB (worker-max-memory-mb); "
            "starting worker %d to replace it",
            index,
            old.proc.pid,
            measured / MB,
            self.bound_bytes // MB,
            free,
        )
        self.slots[free] = Slot(self._start(free, "memory"), self._clock(), "memory", replaces=index)

    def _forget(self, index: int, proc: Proc) -> None:
        _forget(self.shared, index, proc)


def _forget(shared: Shared, index: int, proc: Proc) -> None:
    """Clear what a dead worker held: its permits, its ready flag, its memory, its live metrics."""
    with shared.permits.get_lock():
        for at in range(index * shared.models, (index + 1) * shared.models):
            shared.permits[at] = 0
    shared.ready[index] = 0
    shared.memory[index] = 0
    if proc.pid is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(proc.pid, shared.metrics_dir)
