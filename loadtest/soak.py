"""Soak: hold 80% of measured capacity for N minutes and watch memory, latency and errors, with faults if
asked for.

    python -m loadtest.soak                           # the twin, capacity measured first, 10 minutes
    python -m loadtest.soak --rate 120 --minutes 30   # a fixed rate (requests/s), no measuring
    python -m loadtest.soak --quick --minutes 1       # the tiny model in a temp dir (a smoke run)
    ZHEMBED_WORKERS=2 python -m loadtest.soak --minutes 60 --faults default --worker-max-memory-mb 300

1. ``python -m app`` starts as a subprocess (loadtest.server) on the model, with the in-process vector
   cache off by default (``--cache-bytes``): a cache filling up to its bound is growth by design, and
   would hide a leak under it.
2. Capacity: closed-loop clients (``--capacity-concurrency``) for ``--capacity-s``; requests/s answered
   200. Skipped with ``--rate``.
3. The soak: an open loop at ``--load`` × capacity, requests sent on a fixed schedule. Latency is
   measured from each request's scheduled time, so a server that falls behind shows it (no coordinated
   omission). Texts are drawn from the benchmark corpus, with its lengths.
4. Each minute (``--window-s``): requests, errors, p50/p90/p99/max latency, and the memory of the server's
   whole process tree (the supervisor, its workers, and what they start; :mod:`loadtest.procs`) and of
   each worker, as PSS: shared pages split among the processes that map them, so the rows add up to the
   tree.
5. At the end, per process and for the tree: RSS (as ``top`` shows it), PSS at the start of the soak, at
   the baseline (``--baseline-minute``, 10: the first minutes are the warm-up of allocators and of the
   batch shapes; the start when the soak is shorter) and at the end, the growth of PSS from the baseline
   (the target) and from the start, and the CPU seconds used (how the workers shared the load). Workers
   are shown by slot (:class:`loadtest.faults.Slots`): a worker replaced during the soak is a new pid in
   the same slot, its row marked ``new at …`` (from its first reading) and the old one's ``gone at …``
   (to its last). The targets: the tree's growth and each worker's under 5% (a leak in one of 8 workers
   is under 5% of the tree), no worker gone or new, zero errors.
6. ``--faults`` (:mod:`loadtest.faults`): kill -9 of a worker, Redis stopped and started, a worker
   replaced by the memory bound, and SIGTERM of the service at the end. With faults the soak starts its
   own ``redis-server`` on a free loopback port for the service (``ZHEMBED_REDIS_URL``), and sends
   distinct texts (corpus sentences, numbered), so Redis never answers for the model and the load stays
   the model's. Every request is counted under the fault it met and by its fate (a table); the target is
   then: none lost but those in flight on the killed worker (the soak says how many those were), none
   failed by the Redis restart or the replacement, none lost at the SIGTERM, and the service exiting 0.
   Memory is reported but not judged (workers are killed and replaced).

``--json`` writes the same as a JSON file. With ``ZHEMBED_WORKERS=N`` in the environment, the server
runs N workers. A benchmark, not a test: it runs for minutes and its numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from loadtest import faults, loadgen, procs
from loadtest.corpus import load_corpus, request_bodies
from loadtest.faults import Fault, FaultEvent, FaultSpecError, Request, Slots
from loadtest.harness.cell import distinct_bodies
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess, parse_exposition

GROWTH_TARGET = 0.05
REPLACEMENTS = "zhembed_worker_replacements_total"
BOUND_VARIABLE = "ZHEMBED_WORKER_MAX_MEMORY_MB"
READ_EVERY_S = 1.0  # the tree's memory; a replacement shows between two readings
MAX_WAIT_FOR_READY_S = 120.0  # past the schedule's end, for a killed worker's replacement to be ready


@dataclass
class Window:
    start_s: float  # seconds into the soak
    requests: int
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    tree_mb: float  # PSS of the whole process tree, at the window's last reading
    workers_mb: list[float]  # PSS of each worker then, by slot (a replacement not yet in one, last)
    late_starts: int  # requests sent over 100 ms after their slot: the client pool was exhausted


@dataclass
class Growth:
    """One process of the tree (or the tree, ``pid`` None) over the soak. A process there from the start
    to the end has readings at the start, the baseline and the end; one that started during the soak
    (``first_s``) has its first reading as its start, one that ended (``last_s``) its last as its end."""

    role: str
    pid: int | None
    slot: int | None  # workers only
    first_s: float | None  # when it was first seen, if after the start
    last_s: float | None  # when it was last seen, if before the end
    rss_start_mb: float
    rss_end_mb: float
    pss_start_mb: float
    pss_base_mb: float | None  # None: not there at the baseline
    pss_end_mb: float
    growth: float | None  # of PSS from the baseline to the end (the target): None unless there at both
    growth_start: float | None  # of PSS from its start (or first reading) to the end: None if it ended
    cpu_s: float  # CPU seconds used from its start (or first reading) to its end (or last reading)

    @property
    def new(self) -> bool:
        return self.first_s is not None

    @property
    def gone(self) -> bool:
        return self.last_s is not None

    @property
    def ok(self) -> bool:
        return self.growth is not None and self.growth < GROWTH_TARGET and not self.new and not self.gone


Seen = tuple[float, procs.Process]  # seconds into the soak, the reading


def _growth(
    role: str,
    pid: int | None,
    slot: int | None,
    first: tuple[float, procs.Process | procs.Tree],
    base: procs.Process | procs.Tree | None,
    last: tuple[float, procs.Process | procs.Tree],
    seconds: float,
) -> Growth:
    (t0, a), (t1, b) = first, last
    ended = t1 < seconds
    return Growth(
        role,
        pid,
        slot,
        t0 if t0 > 0 else None,
        t1 if ended else None,
        a.memory.rss / procs.MB,
        b.memory.rss / procs.MB,
        a.memory.pss / procs.MB,
        None if base is None else base.memory.pss / procs.MB,
        b.memory.pss / procs.MB,
        None if base is None or ended else (b.memory.pss - base.memory.pss) / base.memory.pss,
        None if ended else (b.memory.pss - a.memory.pss) / a.memory.pss,
        b.cpu_s - a.cpu_s,
    )


def growth_by_process(
    start: procs.Tree,
    baseline: procs.Tree,
    end: procs.Tree,
    seconds: float,
    seen: dict[int, tuple[Seen, Seen]] | None = None,
    slots: Slots | None = None,
) -> list[Growth]:
    """Each process of any reading, in the order first seen, then the tree.

    Args:
        start, baseline, end: the tree at the soak's start (0 s), its baseline, and its end (``seconds``).
        seen: each pid's first and last reading during the soak (those between start and end).
        slots: the workers' slots.
    """
    seen = dict(seen or {})
    for p in start.processes:
        seen[p.pid] = ((0.0, p), seen.get(p.pid, ((0.0, p), (0.0, p)))[1])
    for p in end.processes:
        seen[p.pid] = (seen.get(p.pid, ((seconds, p), (seconds, p)))[0], (seconds, p))
    base = {p.pid: p for p in baseline.processes}
    rows = []
    for pid, (first, last) in sorted(seen.items(), key=lambda kv: (kv[1][0][0], kv[0])):
        role = first[1].role
        slot = slots.slot(pid) if slots is not None and role == "worker" else None
        rows.append(_growth(role, pid, slot, first, base.get(pid), last, seconds))
    rows.append(_growth("tree", None, None, (0.0, start), baseline, (seconds, end), seconds))
    return rows


@dataclass
class SoakReport:
    model: str
    capacity_rps: float | None
    rate_rps: float
    minutes: float
    texts_per_request: int
    baseline_s: float  # seconds into the soak of the baseline reading (0: the start)
    memory: list[Growth]  # each process, then the tree (the last row)
    requests: int  # answered 200
    errors: int  # every other fate
    first_error: str | None
    status_counts: dict[int, int]
    windows: list[Window] = field(default_factory=list)
    retried: int = 0  # sent again on a new connection (not errors: :class:`loadtest.loadgen._Connection`)
    reopened: int = 0  # idle connections found closed by the server, reopened before a request
    faults: list[FaultEvent] = field(default_factory=list)
    fates: dict[str, dict[str, int]] = field(default_factory=dict)  # fault → fate → requests
    exit_code: int | None = None  # the service's, after the SIGTERM (faults only)
    replacements: float | None = None  # zhembed_worker_replacements_total at the end, where exported
    notes: list[str] = field(default_factory=list)

    @property
    def tree(self) -> Growth:
        return self.memory[-1]

    @property
    def workers(self) -> list[Growth]:
        return [g for g in self.memory if g.role == "worker"]

    @property
    def lost(self) -> dict[str, int]:
        """Per fault, the requests with a fate it does not allow (:func:`loadtest.faults.losses`)."""
        if not self.fates:  # a report from before the fate table: every error counts
            return {faults.NONE: self.errors} if self.errors else {}
        return faults.losses(self.fates)

    @property
    def memory_ok(self) -> bool:
        return (
            self.tree.growth is not None
            and self.tree.growth < GROWTH_TARGET
            and all(w.ok for w in self.workers)
        )

    @property
    def requests_ok(self) -> bool:
        return not self.lost and self.exit_code in (None, 0)

    @property
    def ok(self) -> bool:
        """With faults, the requests' fates and the exit; without, those and the memory."""
        return self.requests_ok and (bool(self.faults) or self.memory_ok)


class Bodies:
    """``/embed`` bodies: the corpus's, round and round (``unique`` False), or distinct texts each time,
    numbered corpus sentences, so a cache never answers one for another (:func:`unique_texts`)."""

    def __init__(self, corpus: list[str], texts: int, seed: int, unique: bool) -> None:
        self.texts = texts
        self.cycle = request_bodies(corpus, texts, seed)
        shuffled = corpus[:]
        random.Random(seed).shuffle(shuffled)
        self.distinct = distinct_bodies(shuffled, texts, 0) if unique else None
        self._next = itertools.count()  # shared by the capacity run and the soak: never the same text

    def __call__(self, n: int) -> tuple[bytes, int]:
        if self.distinct is None:
            return self.cycle[n % len(self.cycle)], self.texts
        return self.distinct(next(self._next))


def measure_capacity(svc: ServiceProcess, bodies: Bodies, concurrency: int, seconds: float) -> float:
    """Requests/s answered 200 by closed-loop clients at ``concurrency``."""
    cell = asyncio.run(
        loadgen.run_cell(
            HOST,
            svc.port,
            "/embed",
            bodies,
            concurrency=concurrency,
            duration_s=seconds,
            warmup_s=min(5.0, seconds / 2),
        )
    )
    if cell.errors:
        print(f"  capacity run: {cell.errors} errors (first: {cell.first_error})", file=sys.stderr)
    return cell.requests_per_s


async def _metric(port: int, name: str) -> float | None:
    """The sum of a metric's series on /metrics, None when it is not there (or /metrics does not answer)."""
    try:
        status, text = await loadgen.get_json(HOST, port, "/metrics")
    except OSError:
        return None
    if status != 200 or not isinstance(text, str):
        return None
    values = [v for k, v in parse_exposition(text).items() if k.split("{")[0] == name]
    return sum(values) if values else None


class _Soak:
    """One open-loop soak with its faults: the senders, the memory readings, and the faults' actions."""

    def __init__(
        self,
        svc: ServiceProcess,
        bodies: Bodies,
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
                except (
                    OSError,
                    asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError,
                    loadgen.HttpError,
                ) as exc:
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
            term = next(e for e in self.events if e.kind == faults.TERM)
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


def _bound_supported() -> bool:
    """Whether this checkout's service has the memory bound (the setting behind ``ZHEMBED_WORKER_MAX_MEMORY_MB``)."""
    from app.settings import Settings

    return "worker_max_memory_mb" in Settings.model_fields


def run(args: argparse.Namespace, model: Path) -> SoakReport:
    seconds = args.minutes * 60
    schedule = faults.parse_faults(args.faults, seconds, args.worker_max_memory_mb is not None)
    notes: list[str] = []
    if any(f.kind == faults.BOUND for f in schedule) and not _bound_supported():
        schedule = [f for f in schedule if f.kind != faults.BOUND]
        notes.append(
            f"bound: skipped: this service has no {BOUND_VARIABLE} (the supervisor does not bound a "
            "worker's memory)"
        )
        print(notes[-1], file=sys.stderr)
    redis_needed = bool(schedule)
    bodies = Bodies(load_corpus(), args.texts, args.seed, unique=redis_needed)
    env = service_env(model, args.variant, args.pool * args.texts, cache_bytes=args.cache_bytes)
    if any(f.kind == faults.BOUND for f in schedule):
        env[BOUND_VARIABLE] = str(args.worker_max_memory_mb)
    redis = faults.RedisServer(args.redis_server, args.redis_max_memory_mb) if redis_needed else None
    if redis is not None:
        redis.start()
        env["ZHEMBED_REDIS_URL"] = redis.url
    log = Path(args.log)
    try:
        with ServiceProcess("app", env, log) as svc:
            capacity = None
            if args.rate is None:
                print(
                    f"measuring capacity: {args.capacity_concurrency} closed-loop clients, {args.capacity_s:.0f} s"
                )
                capacity = measure_capacity(svc, bodies, args.capacity_concurrency, args.capacity_s)
                rate = args.load * capacity
                print(
                    f"  capacity {capacity:.1f} requests/s; soaking at {args.load:.0%}: {rate:.1f} requests/s"
                )
            else:
                rate = args.rate
            start = svc.processes()
            if any(f.kind == faults.KILL for f in schedule) and len(start.workers) < 2:
                raise SystemExit("the kill fault needs 2 workers or more (ZHEMBED_WORKERS=2)")
            print(
                f"soak: {rate:.1f} requests/s × {args.texts} texts for {args.minutes:g} min; "
                f"{len(start.processes)} processes, {len(start.workers)} workers, PSS "
                f"{start.memory.pss / procs.MB:.1f} MB, RSS {start.memory.rss / procs.MB:.1f} MB"
                + (f"; faults {', '.join(_fault_text(f) for f in schedule)}" if schedule else "")
            )
            soak = _Soak(svc, bodies, rate, seconds, args, schedule, redis, start)
            asyncio.run(soak.run())
    finally:
        if redis is not None:
            redis.stop()
    table = faults.fate_table(soak.requests, soak.events, args.settle_s)
    answered = sum(1 for r in soak.requests if r.fate in faults.ANSWERED)
    return SoakReport(
        model=str(model),
        capacity_rps=capacity,
        rate_rps=rate,
        minutes=args.minutes,
        texts_per_request=args.texts,
        baseline_s=soak.baseline_s,
        memory=growth_by_process(
            start, soak.baseline or soak.last, soak.last, soak.seconds, soak.seen, soak.slots
        ),
        requests=answered,
        errors=len(soak.requests) - answered,
        first_error=soak.first_error,
        status_counts=soak.statuses,
        windows=soak.windows(),
        retried=sum(c.retried for c in soak.conns),
        reopened=sum(c.reopened for c in soak.conns),
        faults=soak.events,
        fates=table,
        exit_code=soak.exit_code,
        replacements=soak.replacements,
        notes=notes + soak.notes,
    )


def _fault_text(f: Fault) -> str:
    return f.kind if f.at_s is None else f"{f.kind} at {f.at_s:.0f} s"


def _mb(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.1f}':>{width}}"


def _pct(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:+.1%}':>{width}}"


def render(report: SoakReport) -> str:
    lines = [
        f"{'from s':>6} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'tree MB':>8} {'late':>5}  workers MB"
    ]
    for m in report.windows:
        lines.append(
            f"{m.start_s:>6.0f} {m.requests:>9} {m.errors:>7} {m.p50_ms:>8.1f} {m.p90_ms:>8.1f} {m.p99_ms:>8.1f} "
            f"{m.max_ms:>8.1f} {m.tree_mb:>8.1f} {m.late_starts:>5}  "
            + " ".join(f"{w:.1f}" for w in m.workers_mb)
        )
    base = "the start" if report.baseline_s == 0 else f"{report.baseline_s / 60:g} min"
    lines += [
        "memory in MB; PSS splits each shared page among the processes that map it, so the rows add up to "
        f"the tree; RSS (as top shows it) counts shared pages in every process; base: PSS at {base}; growth: "
        "of PSS from base to the end (the target), and from the start; CPU s: used during the soak; a pid "
        "new during the soak starts at its first reading, one gone ends at its last",
        f"{'process':<18}{'slot':>5}{'pid':>8}{'RSS start':>11}{'RSS end':>9}{'PSS start':>11}{'PSS base':>10}"
        f"{'PSS end':>9}{'growth':>9}{'g. start':>10}{'CPU s':>8}  note",
    ]
    for g in report.memory:
        note = " ".join(
            [
                *([f"new at {g.first_s:.1f} s"] if g.first_s is not None else []),
                *([f"gone at {g.last_s:.1f} s"] if g.last_s is not None else []),
            ]
        )
        lines.append(
            f"{g.role:<18}{'' if g.slot is None else g.slot:>5}{'' if g.pid is None else g.pid:>8}"
            f"{_mb(g.rss_start_mb, 11)}{_mb(g.rss_end_mb, 9)}{_mb(g.pss_start_mb, 11)}{_mb(g.pss_base_mb, 10)}"
            f"{_mb(g.pss_end_mb, 9)}{_pct(g.growth, 9)}{_pct(g.growth_start, 10)}{_mb(g.cpu_s, 8)}  {note}"
        )
    if report.faults:
        lines.append("faults (s into the soak):")
        for e in report.faults:
            end = "-" if e.end_s is None else f"{e.end_s:.1f}"
            lines.append(f"  {e.kind:<12} {e.start_s:>8.1f} → {end:>8}  {e.detail}")
    if report.fates:
        lines += ["every request's fate by the fault it met:", faults.render_table(report.fates)]
    lines += [f"note: {n}" for n in report.notes]
    worst = max((w.growth for w in report.workers if w.growth is not None), default=None)
    memory = "PASS" if report.memory_ok else "FAIL"
    lines.append(
        f"memory: tree PSS {report.tree.pss_start_mb:.1f} MB at the start, "
        + ("" if report.baseline_s == 0 else f"{report.tree.pss_base_mb:.1f} MB at {base}, ")
        + f"{report.tree.pss_end_mb:.1f} MB at the end ({_pct(report.tree.growth, 0).strip()} from {base}), "
        f"{len(report.workers)} worker pids"
        + ("" if worst is None else f" (most growth {worst:+.1%})")
        + f"; target < {GROWTH_TARGET:.0%} each, no worker gone or new: {memory}"
        + (" (not judged with faults)" if report.faults else "")
    )
    on_killed = report.fates.get(faults.ON_KILLED, {})
    lost = report.lost
    lines.append(
        f"requests: {report.requests} answered 200, {report.errors} not; {report.retried} sent again on a new "
        f"connection (counted, not errors), {report.reopened} idle connections found closed; statuses "
        f"{report.status_counts}"
        + (f"; {sum(on_killed.values())} in flight on the killed worker ({on_killed})" if on_killed else "")
        + ("" if report.exit_code is None else f"; the service exited {report.exit_code} after the SIGTERM")
        + ("" if report.replacements is None else f"; {REPLACEMENTS} {report.replacements:g}")
        + f"; lost where no loss is allowed: {lost or 0} (target 0): {'PASS' if report.requests_ok else 'FAIL'}"
    )
    if report.first_error:
        lines.append(f"first error: {report.first_error}")
    lines.append("PASS" if report.ok else "FAIL")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", type=Path, default=Path("models/bert-base-chinese-twin"))
    p.add_argument("--variant", default="int8", help="ZHEMBED_VARIANT of the service")
    p.add_argument("--minutes", type=float, default=10.0, help="how long to hold the load")
    p.add_argument("--rate", type=float, default=None, help="requests/s to hold; default --load × capacity")
    p.add_argument("--load", type=float, default=0.8, help="share of measured capacity to hold")
    p.add_argument("--capacity-s", type=float, default=20.0, help="seconds of the capacity measurement")
    p.add_argument("--capacity-concurrency", type=int, default=32)
    p.add_argument("--texts", type=int, default=4, help="texts per request")
    p.add_argument("--window-s", type=float, default=60.0, help="seconds per row of the latency table")
    p.add_argument(
        "--baseline-minute",
        type=float,
        default=10.0,
        help="growth is measured from this minute to the end (from the start when the soak is shorter)",
    )
    p.add_argument("--pool", type=int, default=64, help="client connections (the most requests in flight)")
    p.add_argument("--cache-bytes", type=int, default=0, help="ZHEMBED_CACHE_BYTES of the service")
    p.add_argument(
        "--faults",
        default="",
        help="kill@T, redis@T, bound, comma-separated (T: 90s, 12m or 25%%), or 'default'; SIGTERM at the end",
    )
    p.add_argument(
        "--redis-down-s", type=float, default=30.0, help="how long the redis fault keeps Redis down"
    )
    p.add_argument(
        "--settle-s", type=float, default=10.0, help="a fault's window runs this long after the fault is over"
    )
    p.add_argument(
        "--worker-max-memory-mb",
        type=int,
        default=None,
        help=f"{BOUND_VARIABLE} of the service, for the bound fault: a worker's PSS at which it is replaced",
    )
    p.add_argument("--redis-server", default="redis-server", help="the redis-server the faults start")
    p.add_argument("--redis-max-memory-mb", type=int, default=128, help="that Redis's maxmemory (LRU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="loadtest/results/soak-server.log", help="the server's output")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    p.add_argument("--quick", action="store_true", help="the tiny model, exported into a temp dir")
    args = p.parse_args(argv)
    try:
        faults.parse_faults(args.faults, args.minutes * 60, args.worker_max_memory_mb is not None)
    except FaultSpecError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # --quick: the tiny model in a temp dir
    model_in: AbstractContextManager[Path] = (
        tiny_model(None, ("fp32", "int8"), 3) if args.quick else nullcontext(args.model)
    )
    with model_in as model:
        report = run(args, model)
    print(render(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
