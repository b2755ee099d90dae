"""The soak's open loop: requests sent on a fixed schedule (latency from each one's slot, so a server that
falls behind shows it), the server's process tree read every second, and the faults acted out at their
times (:mod:`loadtest.soak.faults`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
import time
from argparse import Namespace
from collections import Counter, defaultdict
from collections.abc import Iterator

import httpx
import numpy as np
import psutil

from loadtest import loadgen, procs
from loadtest.loadgen import BodyFactory
from loadtest.server import HOST, RedisServer, ServiceProcess, get
from loadtest.soak import faults
from loadtest.soak.faults import Fault, FaultEvent, PidSlots, SentRequest
from loadtest.soak.report import REPLACEMENTS, Seen, Window

READ_EVERY_S = 1.0  # the tree's memory; a replacement shows between two readings
MAX_WAIT_FOR_READY_S = 120.0  # past the schedule's end, for a killed worker's replacement to be ready


class OpenLoop:
    """One open-loop soak with its faults: the senders, the memory readings, and the faults' actions."""

    def __init__(
        self, svc: ServiceProcess, bodies: BodyFactory, rps: float, args: Namespace, redis: RedisServer | None
    ) -> None:
        """``rps``: requests/s to send; ``args``: the command line's (``schedule``: its faults, parsed)."""
        self.svc, self.bodies, self.rate, self.redis, self.args = svc, bodies, rps, redis, args
        self.first = first = procs.tree(svc.pid)
        self.seconds, self.pool, self.window_s = args.minutes * 60, args.pool, args.window_s
        self.schedule: list[Fault] = args.schedule
        self.bound = any(f.kind == faults.BOUND for f in self.schedule)
        self.baseline_s = args.baseline_minute * 60 if self.seconds > args.baseline_minute * 60 else 0.0
        self.baseline: procs.Tree | None = first if self.baseline_s == 0 else None
        self.last: procs.Tree = first
        self.slots = PidSlots([w.pid for w in first.workers])
        self.seen: dict[int, tuple[Seen, Seen]] = {}
        self.memory: dict[int, procs.Tree] = {}
        self.events: list[FaultEvent] = []
        self.slot_event: dict[int, FaultEvent] = {}  # slot → the event its next new pid ends (not a kill)
        self.waiting: dict[int, FaultEvent] = {}  # a replacement started before the old one stopped
        self.busy: dict[loadgen._Connection, int] = {}  # connection → the id of the request in flight on it
        self.conns: list[loadgen._Connection] = []
        self.tasks: list[asyncio.Task[None]] = []  # started by a fault, awaited at the end
        self.notes: list[str] = []
        self.requests: list[SentRequest] = []
        self.latency: defaultdict[int, list[float]] = defaultdict(list)  # by window, as are errors and late
        self.errors: Counter[int] = Counter()
        self.late: Counter[int] = Counter()
        self.statuses: Counter[int] = Counter()
        self.first_error: str | None = None
        self.stopped = False  # no more sending: the SIGTERM went out, or the service is gone
        self.exit_code: int | None = None
        self.replacements: float | None = None
        self.start = 0.0

    def now_s(self) -> float:
        return time.perf_counter() - self.start

    def bucket(self, t_s: float) -> int:
        return int(t_s // self.window_s)

    def event(self, kind: str, detail: str, t: float | None = None) -> FaultEvent:
        """A new event, begun at ``t`` (now when None), not yet over."""
        event = FaultEvent(kind, self.now_s() if t is None else t, None, detail)
        self.events.append(event)
        return event

    async def sender(self, slots: Iterator[int]) -> None:
        conn = loadgen._Connection(HOST, self.svc.port)
        self.conns.append(conn)
        try:
            for n in slots:
                scheduled = n / self.rate
                if scheduled >= self.seconds or self.stopped:
                    return
                if (delay := scheduled - self.now_s()) > 0:
                    await asyncio.sleep(delay)
                elif delay < -0.1:
                    self.late[self.bucket(scheduled)] += 1
                if self.stopped or scheduled >= self.seconds:  # the end came while it waited for its slot
                    return
                body, _ = self.bodies(n)
                sent = self.now_s()
                self.busy[conn] = n
                status: int | None = None
                payload = b""
                error: BaseException | None = None
                try:
                    status, payload = await conn.request("POST", "/embed", body)
                except loadgen.FAILED as exc:
                    conn.close()
                    error = exc
                finally:
                    del self.busy[conn]
                ended = self.now_s()
                fate = faults.fate_of(status, error, conn.received, conn.last_retried)
                self.requests.append(SentRequest(n, sent, ended, fate))
                window = self.bucket(scheduled)
                if status is not None:
                    self.statuses[status] += 1
                if fate in faults.ANSWERED:
                    self.latency[window].append((ended - scheduled) * 1000)
                    continue
                self.errors[window] += 1
                if self.first_error is None:
                    why = f"{type(error).__name__}: {error}" if error else f"HTTP {status}: {payload[:200]!r}"
                    self.first_error = f"{fate} at {ended:.1f} s ({why})"
        finally:
            conn.close()

    def read(self, tree: procs.Tree, t: float) -> None:
        """One reading of the tree: the window's memory, the baseline, each pid's first and last, slots."""
        self.last = tree
        self.memory[self.bucket(t)] = tree
        if self.baseline is None and t >= self.baseline_s:
            self.baseline = tree
        for p in tree.processes:
            self.seen[p.pid] = (self.seen.get(p.pid, ((t, p), (t, p)))[0], (t, p))
        for change, pid, slot, _ in self.slots.update([w.pid for w in tree.workers], t):
            self.on_change(change, pid, slot, t)

    def on_change(self, change: str, pid: int, slot: int | None, t: float) -> None:
        """Turn a slot's change into the end of a fault, or into an event of its own."""
        if change == "waiting":  # a replacement before the old one stopped: what the memory bound does
            detail = f"worker pid {pid} started while every slot was full"
            self.waiting[pid] = self.event(faults.BOUND, detail, t)
        elif change == "gone" and slot is not None and slot not in self.slot_event:  # not killed
            if self.waiting:
                event = self.waiting.pop(min(self.waiting, key=lambda p: self.waiting[p].start_s))
                event.end_s = t
                event.detail += f"; pid {pid} (slot {slot}) gone at {t:.1f} s"
            else:
                kind = faults.BOUND if self.bound else faults.LOST_WORKER
                detail = f"worker pid {pid} (slot {slot}) gone, not killed by the soak"
                self.slot_event[slot] = self.event(kind, detail, t)
        elif change == "new" and slot is not None:
            self.waiting.pop(pid, None)
            if (closing := self.slot_event.pop(slot, None)) is not None:
                if closing.kind != faults.KILL:  # a kill is over when the service is ready again
                    closing.end_s = t
                closing.detail += f"; pid {pid} in slot {slot} at {t:.1f} s"

    async def sample_memory(self) -> None:
        await asyncio.sleep(max(0.0, -self.now_s()))  # from the start of the schedule
        while not self.stopped and self.now_s() < self.seconds:
            try:
                # in a thread: reading page tables takes milliseconds the senders should not wait for
                tree = await asyncio.to_thread(procs.tree, self.svc.pid)
            except psutil.NoSuchProcess:  # the service itself is gone
                self.stopped = True
                assert self.svc.proc is not None
                self.exit_code = self.svc.proc.wait()
                self.event(faults.LOST_WORKER, f"the service exited ({self.exit_code})")
                return
            self.read(tree, self.now_s())
            await asyncio.sleep(READ_EVERY_S)

    async def kill(self) -> None:
        """SIGKILL of the worker in the lowest slot, noting the requests in flight on it first. All in one
        step of the event loop: no request starts or ends between the reading and the signal."""
        live = sorted((s, p) for p in self.slots.live if (s := self.slots.slot(p)) is not None)
        if len(live) < 2:
            self.event(faults.KILL, "skipped: fewer than 2 workers").end_s = self.now_s()
            return
        slot, pid = live[0]
        ports: set[int] = set()
        with contextlib.suppress(psutil.Error):  # a zombie's sockets
            ports = procs.peer_ports(pid, self.svc.port)
        on_it = sorted(n for conn, n in self.busy.items() if conn.local_port in ports)
        os.kill(pid, signal.SIGKILL)
        event = self.event(
            faults.KILL,
            f"SIGKILL of worker pid {pid} (slot {slot}): {len(on_it)} requests in flight on it, "
            f"{len(ports)} connections held, {len(self.busy)} in flight in all",
        )
        event.on_killed = on_it
        self.slot_event[slot] = event
        self.tasks.append(asyncio.create_task(self.ready_again(event, slot)))

    async def ready_again(self, event: FaultEvent, slot: int) -> None:
        """End ``event`` when the slot has a new pid and /ready answers 200 again: every worker, the
        replacement too, is ready (until the supervisor sees the death, /ready still counts the dead one)."""
        while not self.stopped:
            await asyncio.sleep(0.25)
            if slot in self.slot_event:  # no new pid in it yet
                continue
            try:
                status = (await asyncio.to_thread(get, self.svc.port, "/ready")).status_code
            except httpx.TransportError:
                continue
            if status == 200:
                event.end_s = self.now_s()
                event.detail += f"; the service ready again at {event.end_s:.1f} s"
                return
        event.detail += "; the replacement was not ready by the end"

    async def redis_fault(self) -> None:
        assert self.redis is not None
        await asyncio.to_thread(self.redis.stop)
        event = self.event(faults.REDIS, f"redis-server stopped for {self.args.redis_down_s:g} s")
        await asyncio.sleep(self.args.redis_down_s)
        await asyncio.to_thread(self.redis.start)
        event.end_s = self.now_s()
        event.detail += f"; back (empty) at {event.end_s:.1f} s"

    async def finish(self) -> None:
        """At the end of the schedule: the last reading, the metric, then (with faults) the SIGTERM and the
        service's exit."""
        end = self.seconds
        await asyncio.sleep(max(0.0, end - self.now_s()))
        if self.tasks:
            # A SIGTERM to a replacement still starting would be a fault of its own (a worker without its
            # handlers yet dies by the signal): the load goes on until it is ready, bounded.
            self.seconds = math.inf
            await asyncio.wait(self.tasks, timeout=MAX_WAIT_FOR_READY_S)
        self.seconds = self.now_s()
        if self.seconds - end > 1.0:
            self.notes.append(
                f"the schedule ran {self.seconds - end:.1f} s past its end, until the killed worker's "
                "replacement was ready"
            )
        if self.stopped:
            return
        self.read(await asyncio.to_thread(procs.tree, self.svc.pid), self.seconds)
        series = await asyncio.to_thread(self.svc.metrics) or {}
        replaced = [v for k, v in series.items() if k.split("{")[0] == REPLACEMENTS]
        self.replacements = sum(replaced) if replaced else None
        if not self.schedule:
            return
        self.stopped = True
        assert self.svc.proc is not None
        self.svc.proc.send_signal(signal.SIGTERM)
        term = self.event(faults.TERM, f"SIGTERM of the service: {len(self.busy)} requests in flight")
        # longer than the service's drain + grace (2 + 25 s by default)
        self.exit_code = await asyncio.to_thread(self.svc.proc.wait, 60.0)
        term.end_s = self.now_s()
        term.detail += f"; exited {self.exit_code} at {term.end_s:.1f} s"

    async def run_faults(self) -> None:
        for fault in self.schedule:
            if fault.at_s is None:  # bound fires on its own, term is finish()'s
                continue
            await asyncio.sleep(max(0.0, fault.at_s - self.now_s()))
            if self.stopped:
                return
            await (self.kill() if fault.kind == faults.KILL else self.redis_fault())

    async def run(self) -> None:
        self.start = time.perf_counter() + 0.5
        slots = itertools.count()
        senders = (self.sender(slots) for _ in range(self.pool))
        await asyncio.gather(self.sample_memory(), self.finish(), self.run_faults(), *senders)
        await asyncio.gather(*self.tasks)

    def windows(self) -> list[Window]:
        return [self.window(m) for m in range(math.ceil(self.seconds / self.window_s))]

    def window(self, m: int) -> Window:
        """The ``m``-th window's latency, errors and memory (its last reading; workers by slot)."""
        lat = self.latency.get(m, [])
        p50, p90, p99, top = (float(x) for x in np.percentile(lat or [math.nan], [50, 90, 99, 100]))
        tree = self.memory.get(m)
        workers = sorted(tree.workers if tree else (), key=lambda w: self.slots.of.get(w.pid, math.inf))
        pss = tree.memory.pss / procs.MB if tree else math.nan
        mb = [w.memory.pss / procs.MB for w in workers]
        return Window(m * self.window_s, len(lat), self.errors[m], p50, p90, p99, top, pss, mb, self.late[m])
