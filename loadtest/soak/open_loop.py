"""The soak's open loop: requests sent on a fixed schedule (latency from each one's slot, so a server that
falls behind shows it), the server's process tree read every second, and the faults acted out at their
times (:mod:`loadtest.soak.faults`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator

import numpy as np

from loadtest import loadgen, procs
from loadtest.server import HOST, ServiceProcess, scrape
from loadtest.soak import faults
from loadtest.soak.faults import Fault, FaultEvent, Request, Slots
from loadtest.soak.report import REPLACEMENTS, Seen, Window

READ_EVERY_S = 1.0  # the tree's memory; a replacement shows between two readings
MAX_WAIT_FOR_READY_S = 120.0  # past the schedule's end, for a killed worker's replacement to be ready


async def _metric(port: int, name: str) -> float | None:
    """The sum of a metric's series on /metrics, None when it is not there (or /metrics does not answer)."""
    try:
        series = await scrape(port)
    except OSError:
        return None
    values = [v for k, v in series.items() if k.split("{")[0] == name]
    return sum(values) if values else None


class OpenLoop:
    """One open-loop soak with its faults: the senders, the memory readings, and the faults' actions."""

    def __init__(
        self,
        svc: ServiceProcess,
        bodies: loadgen.BodyFactory,
        rate: float,
        seconds: float,
        args: argparse.Namespace,
        schedule: list[Fault],
        redis: faults.RedisServer | None,
        first: procs.Tree,
    ) -> None:
        self.svc, self.bodies, self.rate, self.seconds = svc, bodies, rate, seconds
        self.pool, self.window_s, self.args = args.pool, args.window_s, args
        self.schedule, self.redis = schedule, redis
        self.bound = any(f.kind == faults.BOUND for f in schedule)
        self.first = first
        self.baseline_s = args.baseline_minute * 60 if seconds > args.baseline_minute * 60 else 0.0
        self.baseline: procs.Tree | None = first if self.baseline_s == 0 else None
        self.last: procs.Tree = first
        self.slots = Slots([w.pid for w in first.workers])
        self.seen: dict[int, tuple[Seen, Seen]] = {}
        self.memory: dict[int, procs.Tree] = {}
        self.events: list[FaultEvent] = []
        self.killed: dict[int, FaultEvent] = {}  # pid → its kill
        self.slot_event: dict[int, FaultEvent] = {}  # slot → the event its next new pid ends
        self.waiting: dict[int, FaultEvent] = {}  # a replacement started before the old one stopped
        self.busy: dict[loadgen._Connection, int] = {}  # connection → the id of the request in flight on it
        self.conns: list[loadgen._Connection] = []
        self.tasks: list[asyncio.Task[None]] = []  # started by a fault, awaited at the end
        self.notes: list[str] = []
        self.requests: list[Request] = []
        self.latency: dict[int, list[float]] = {}
        self.errors: dict[int, int] = {}
        self.late: dict[int, int] = {}
        self.statuses: dict[int, int] = {}
        self.first_error: str | None = None
        self.stopped = False  # no more sending: the SIGTERM went out, or the service is gone
        self.exit_code: int | None = None
        self.replacements: float | None = None
        self.start = 0.0

    def now_s(self) -> float:
        return time.perf_counter() - self.start

    def bucket(self, t_s: float) -> int:
        return int(t_s // self.window_s)

    async def sender(self, slots: Iterator[int]) -> None:
        conn = loadgen._Connection(HOST, self.svc.port)
        self.conns.append(conn)
        interval = 1.0 / self.rate
        try:
            while True:
                n = next(slots)
                scheduled = n * interval
                if scheduled >= self.seconds or self.stopped:
                    return
                delay = scheduled - self.now_s()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -0.1:
                    self.late[self.bucket(scheduled)] = self.late.get(self.bucket(scheduled), 0) + 1
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
                self.requests.append(Request(n, sent, ended, fate))
                window = self.bucket(scheduled)
                if status is not None:
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                if fate in faults.ANSWERED:
                    self.latency.setdefault(window, []).append((ended - scheduled) * 1000)
                    continue
                self.errors[window] = self.errors.get(window, 0) + 1
                if self.first_error is None:
                    what = (
                        f"HTTP {status}: {payload[:200]!r}"
                        if error is None
                        else f"{type(error).__name__}: {error}"
                    )
                    self.first_error = f"{fate} at {ended:.1f} s ({what})"
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
        for change, pid, slot, since in self.slots.update([w.pid for w in tree.workers], t):
            self.on_change(change, pid, slot, since, t)

    def on_change(self, change: str, pid: int, slot: int | None, since: float, t: float) -> None:
        """Turn a slot's change into the end of a fault, or into an event of its own."""
        if change == "waiting":  # a replacement before the old one stopped: what the memory bound does
            event = FaultEvent(faults.BOUND, t, None, f"worker pid {pid} started while every slot was full")
            self.waiting[pid] = event
            self.events.append(event)
        elif change == "gone" and slot is not None:
            if pid in self.killed:
                self.slot_event[slot] = self.killed[pid]
            elif self.waiting:
                event = self.waiting.pop(min(self.waiting, key=lambda p: self.waiting[p].start_s))
                event.end_s = t
                event.detail += f"; pid {pid} (slot {slot}) gone at {t:.1f} s"
            else:
                kind = faults.BOUND if self.bound else faults.LOST_WORKER
                event = FaultEvent(
                    kind, t, None, f"worker pid {pid} (slot {slot}) gone, not killed by the soak"
                )
                self.slot_event[slot] = event
                self.events.append(event)
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
                # In a thread: reading a few hundred MB of page tables takes milliseconds, which the event
                # loop sending the requests should not wait for.
                tree = await asyncio.to_thread(self.svc.processes)
            except OSError:  # the service itself is gone
                self.stopped = True
                code = self.svc.proc.wait() if self.svc.proc is not None else None
                self.events.append(
                    FaultEvent(faults.LOST_WORKER, self.now_s(), None, f"the service exited ({code})")
                )
                return
            self.read(tree, self.now_s())
            await asyncio.sleep(READ_EVERY_S)

    def kill(self) -> None:
        """SIGKILL of the worker in the lowest slot, noting the requests in flight on it first. All in one
        step of the event loop: no request starts or ends between the reading and the signal."""
        live = sorted((s, p) for p in self.slots.live if (s := self.slots.slot(p)) is not None)
        if len(live) < 2:
            self.events.append(
                FaultEvent(faults.KILL, self.now_s(), self.now_s(), "skipped: fewer than 2 workers")
            )
            return
        slot, pid = live[0]
        try:
            ports = procs.peer_ports(pid, self.svc.port)
        except OSError:
            ports = set()
        on_it = sorted(n for conn, n in self.busy.items() if conn.local_port in ports)
        os.kill(pid, signal.SIGKILL)
        t = self.now_s()
        event = FaultEvent(
            faults.KILL,
            t,
            None,
            f"SIGKILL of worker pid {pid} (slot {slot}): {len(on_it)} requests in flight on it, "
            f"{len(ports)} connections held, {len(self.busy)} in flight in all",
            on_it,
        )
        self.killed[pid] = event
        self.events.append(event)
        self.tasks.append(asyncio.create_task(self.ready_again(event, slot, pid)))

    async def ready_again(self, event: FaultEvent, slot: int, killed: int) -> None:
        """End ``event`` when the slot has a new pid and /ready answers 200 again: every worker, the
        replacement too, is ready (until the supervisor sees the death, /ready still counts the dead one)."""
        while not self.stopped:
            await asyncio.sleep(0.25)
            if self.slots.holder(slot) in (None, killed):
                continue
            try:
                status, _ = await loadgen.get_json(HOST, self.svc.port, "/ready")
            except OSError:
                continue
            if status == 200:
                event.end_s = self.now_s()
                event.detail += f"; the service ready again at {event.end_s:.1f} s"
                return
        event.detail += "; the replacement was not ready by the end"

    async def redis_fault(self) -> None:
        assert self.redis is not None
        await asyncio.to_thread(self.redis.stop)
        event = FaultEvent(
            faults.REDIS, self.now_s(), None, f"redis-server stopped for {self.args.redis_down_s:g} s"
        )
        self.events.append(event)
        await asyncio.sleep(self.args.redis_down_s)
        await asyncio.to_thread(self.redis.start)
        event.end_s = self.now_s()
        event.detail += f"; back (empty) at {event.end_s:.1f} s"

    async def finish(self) -> None:
        """At the end of the schedule: the last reading, the metric, then the SIGTERM (with faults)."""
        await asyncio.sleep(max(0.0, self.seconds - self.now_s()))
        # A SIGTERM while a killed worker's replacement is still starting would be a fault of its own (a
        # worker that has not yet installed its handlers dies by the signal): the load goes on until the
        # replacement is ready, bounded.
        waited = self.now_s()
        while (
            not self.stopped
            and any(e.kind == faults.KILL and e.end_s is None for e in self.events)
            and self.now_s() < waited + MAX_WAIT_FOR_READY_S
        ):
            self.seconds = self.now_s() + 0.5  # the senders go on
            await asyncio.sleep(0.25)
        self.seconds = self.now_s()
        if self.seconds - waited > 1.0:
            self.notes.append(
                f"the schedule ran {self.seconds - waited:.1f} s past its end, until the killed worker's "
                "replacement was ready"
            )
        if self.stopped:
            return
        self.read(await asyncio.to_thread(self.svc.processes), self.seconds)
        self.replacements = await _metric(self.svc.port, REPLACEMENTS)
        if not self.schedule:
            return
        self.stopped = True
        assert self.svc.proc is not None
        self.svc.proc.send_signal(signal.SIGTERM)
        t = self.now_s()
        self.events.append(
            FaultEvent(faults.TERM, t, None, f"SIGTERM of the service: {len(self.busy)} requests in flight")
        )

    async def run_faults(self) -> None:
        for fault in self.schedule:
            if fault.at_s is None:  # bound fires on its own, term is finish()'s
                continue
            await asyncio.sleep(max(0.0, fault.at_s - self.now_s()))
            if self.stopped:
                return
            if fault.kind == faults.KILL:
                self.kill()
            elif fault.kind == faults.REDIS:
                await self.redis_fault()

    async def run(self) -> None:
        self.start = time.perf_counter() + 0.5
        slots = iter(range(sys.maxsize))
        sampler = asyncio.create_task(self.sample_memory())
        finisher = asyncio.create_task(self.finish())
        injector = asyncio.create_task(self.run_faults())
        await asyncio.gather(*(self.sender(slots) for _ in range(self.pool)))
        await finisher
        await injector
        await sampler
        await asyncio.gather(*self.tasks)
        if self.schedule and self.svc.proc is not None:
            grace = 60.0  # more than the service's drain + grace (2 + 25 s by default)
            self.exit_code = await asyncio.to_thread(self.svc.proc.wait, grace)
            term = next((e for e in self.events if e.kind == faults.TERM), None)
            if term is not None:  # none where the service ended before the schedule did
                term.end_s = self.now_s()
                term.detail += f"; exited {self.exit_code} at {term.end_s:.1f} s"

    def windows(self) -> list[Window]:
        rows = []
        for m in range(int(np.ceil(self.seconds / self.window_s))):
            lat = np.array(self.latency.get(m, [float("nan")]))
            tree = self.memory.get(m)
            workers = (
                sorted(
                    tree.workers,
                    key=lambda w: (self.slots.slot(w.pid) is None, self.slots.slot(w.pid) or 0, w.pid),
                )
                if tree
                else []
            )
            rows.append(
                Window(
                    start_s=m * self.window_s,
                    requests=len(self.latency.get(m, [])),
                    errors=self.errors.get(m, 0),
                    p50_ms=float(np.percentile(lat, 50)),
                    p90_ms=float(np.percentile(lat, 90)),
                    p99_ms=float(np.percentile(lat, 99)),
                    max_ms=float(np.max(lat)),
                    tree_mb=tree.memory.pss / procs.MB if tree else float("nan"),
                    workers_mb=[w.memory.pss / procs.MB for w in workers],
                    late_starts=self.late.get(m, 0),
                )
            )
        return rows
