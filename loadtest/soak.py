"""Soak: hold 80% of measured capacity for N minutes and watch memory, latency and errors.

    python -m loadtest.soak                           # the twin, capacity measured first, 10 minutes
    python -m loadtest.soak --rate 120 --minutes 30   # a fixed rate (requests/s), no measuring
    python -m loadtest.soak --quick --minutes 1       # the tiny model in a temp dir (a smoke run)

1. ``python -m app`` starts as a subprocess (loadtest.server) on the model, with the in-process vector
   cache off by default (``--cache-bytes``): a cache filling up to its bound is growth by design, and
   would hide a leak under it.
2. Capacity: closed-loop clients (``--capacity-concurrency``) for ``--capacity-s``; requests/s answered
   200. Skipped with ``--rate``.
3. The soak: an open loop at ``--load`` × capacity, requests sent on a fixed schedule. Latency is
   measured from each request's scheduled time, so a server that falls behind shows it (no coordinated
   omission). Texts are drawn from the benchmark corpus.
4. Each minute (``--window-s``): requests, errors, p50/p90/p99/max latency, and the memory of the server's
   whole process tree (the supervisor, its workers, and what they start; :mod:`loadtest.procs`) and of
   each worker, as PSS: shared pages split among the processes that map them, so the rows add up to the
   tree. At the end, per process and for the tree: RSS (as ``top`` shows it) and PSS at the start of the
   soak and at the end, the growth of PSS in percent, and the CPU seconds used (how the workers shared
   the load); errors; and whether the targets were met: the tree's growth and each worker's under 5% (a
   leak in one of 8 workers is under 5% of the tree), no worker gone or replaced, zero errors. ``--json`` writes the same as a JSON file. With
   ``ZHEMBED_WORKERS=N`` in the environment, the server runs N workers.

A benchmark, not a test: it runs for minutes and its numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from loadtest import loadgen, procs
from loadtest.corpus import load_corpus, request_bodies
from loadtest.quick_model import quick_model
from loadtest.server import HOST, ServiceProcess

GROWTH_TARGET = 0.05


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
    workers_mb: list[float]  # PSS of each worker then, in the order the tree lists them
    late_starts: int  # requests sent over 100 ms after their slot: the client pool was exhausted


@dataclass
class Growth:
    """One process of the tree (or the tree, ``pid`` None) from the start of the soak to its end; None
    where it was not there (a process that ended, or one that started during the soak)."""

    role: str
    pid: int | None
    rss_start_mb: float | None
    rss_end_mb: float | None
    pss_start_mb: float | None
    pss_end_mb: float | None
    growth: float | None  # of PSS
    cpu_s: float | None  # CPU seconds used from the start to the end: how the work was shared

    @classmethod
    def of(
        cls,
        role: str,
        pid: int | None,
        start: procs.Process | procs.Tree | None,
        end: procs.Process | procs.Tree | None,
    ) -> Growth:
        """From the process (or the tree) in the readings at the soak's start and at its end."""
        grew = cpu = None
        if start is not None and end is not None:
            grew = (end.memory.pss - start.memory.pss) / start.memory.pss
            cpu = end.cpu_s - start.cpu_s
        return cls(
            role,
            pid,
            None if start is None else start.memory.rss / procs.MB,
            None if end is None else end.memory.rss / procs.MB,
            None if start is None else start.memory.pss / procs.MB,
            None if end is None else end.memory.pss / procs.MB,
            grew,
            cpu,
        )

    @property
    def ok(self) -> bool:
        return self.growth is not None and self.growth < GROWTH_TARGET


def growth_by_process(start: procs.Tree, end: procs.Tree) -> list[Growth]:
    """Each process of either reading, in the order first seen, then the tree."""
    before = {p.pid: p for p in start.processes}
    after = {p.pid: p for p in end.processes}
    rows = []
    for pid in dict.fromkeys([*before, *after]):
        first = before.get(pid) or after[pid]
        rows.append(Growth.of(first.role, pid, before.get(pid), after.get(pid)))
    rows.append(Growth.of("tree", None, start, end))
    return rows


@dataclass
class SoakReport:
    model: str
    capacity_rps: float | None
    rate_rps: float
    minutes: float
    texts_per_request: int
    memory: list[Growth]  # each process, then the tree (the last row)
    requests: int
    errors: int
    first_error: str | None
    status_counts: dict[int, int]
    windows: list[Window] = field(default_factory=list)

    @property
    def tree(self) -> Growth:
        return self.memory[-1]

    @property
    def workers(self) -> list[Growth]:
        return [g for g in self.memory if g.role == "worker"]

    @property
    def ok(self) -> bool:
        return self.errors == 0 and self.tree.ok and all(w.ok for w in self.workers)


def measure_capacity(
    svc: ServiceProcess, bodies: list[bytes], texts: int, concurrency: int, seconds: float
) -> float:
    """Requests/s answered 200 by closed-loop clients at ``concurrency``."""
    cell = asyncio.run(
        loadgen.run_cell(
            HOST,
            svc.port,
            "/embed",
            loadgen.cycle(bodies, texts),
            concurrency=concurrency,
            duration_s=seconds,
            warmup_s=min(5.0, seconds / 2),
        )
    )
    if cell.errors:
        print(f"  capacity run: {cell.errors} errors (first: {cell.first_error})", file=sys.stderr)
    return cell.requests_per_s


async def _soak(
    svc: ServiceProcess, bodies: list[bytes], rate: float, seconds: float, pool: int, window_s: float
) -> tuple[list[Window], int, int, str | None, dict[int, int]]:
    """Send ``rate`` requests/s for ``seconds`` on a fixed schedule; statistics per ``window_s``."""
    interval = 1.0 / rate
    start = time.perf_counter() + 0.5
    end = start + seconds
    slots = iter(range(sys.maxsize))
    buckets: dict[int, list[float]] = {}
    errors: dict[int, int] = {}
    late: dict[int, int] = {}
    statuses: dict[int, int] = {}
    first_error: list[str] = []
    memory: dict[int, procs.Tree] = {}

    def bucket(t: float) -> int:
        return int((t - start) // window_s)

    async def worker() -> None:
        conn = loadgen._Connection(HOST, svc.port)
        try:
            while True:
                n = next(slots)
                scheduled = start + n * interval
                if scheduled >= end:
                    return
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -0.1:
                    late[bucket(scheduled)] = late.get(bucket(scheduled), 0) + 1
                window = bucket(scheduled)
                try:
                    status, payload = await conn.request("POST", "/embed", bodies[n % len(bodies)])
                except (OSError, asyncio.IncompleteReadError, loadgen.HttpError) as exc:
                    conn.close()
                    errors[window] = errors.get(window, 0) + 1
                    if not first_error:
                        first_error.append(f"{type(exc).__name__}: {exc}")
                    continue
                statuses[status] = statuses.get(status, 0) + 1
                if status != 200:
                    errors[window] = errors.get(window, 0) + 1
                    if not first_error:
                        first_error.append(f"HTTP {status}: {payload[:200]!r}")
                    continue
                buckets.setdefault(window, []).append((time.perf_counter() - scheduled) * 1000)
        finally:
            conn.close()

    async def sample_memory() -> None:
        while time.perf_counter() < end:
            # In a thread: reading a few hundred MB of page tables takes milliseconds, which the event loop
            # sending the requests should not wait for.
            memory[bucket(time.perf_counter())] = await asyncio.to_thread(svc.processes)
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_memory())
    await asyncio.gather(*(worker() for _ in range(pool)))
    await sampler
    windows = []
    for m in range(int(np.ceil(seconds / window_s))):
        lat = np.array(buckets.get(m, [float("nan")]))
        tree = memory.get(m)
        windows.append(
            Window(
                start_s=m * window_s,
                requests=len(buckets.get(m, [])),
                errors=errors.get(m, 0),
                p50_ms=float(np.percentile(lat, 50)),
                p90_ms=float(np.percentile(lat, 90)),
                p99_ms=float(np.percentile(lat, 99)),
                max_ms=float(np.max(lat)),
                tree_mb=tree.memory.pss / procs.MB if tree else float("nan"),
                workers_mb=[w.memory.pss / procs.MB for w in tree.workers] if tree else [],
                late_starts=late.get(m, 0),
            )
        )
    ok = sum(len(v) for v in buckets.values())
    return windows, ok, sum(errors.values()), (first_error[0] if first_error else None), statuses


def run(args: argparse.Namespace, model: Path) -> SoakReport:
    bodies = request_bodies(load_corpus(), args.texts, args.seed)
    env = {
        "ZHEMBED_MODEL": str(model),
        "ZHEMBED_VARIANT": args.variant,
        "ZHEMBED_LOG_LEVEL": "warning",
        "ZHEMBED_CACHE_BYTES": str(args.cache_bytes),
        "ZHEMBED_MAX_CONCURRENT_INPUTS": str(max(512, args.pool * args.texts)),
    }
    log = Path(args.log)
    with ServiceProcess("app", env, log) as svc:
        capacity = None
        if args.rate is None:
            print(
                f"measuring capacity: {args.capacity_concurrency} closed-loop clients, {args.capacity_s:.0f} s"
            )
            capacity = measure_capacity(svc, bodies, args.texts, args.capacity_concurrency, args.capacity_s)
            rate = args.load * capacity
            print(f"  capacity {capacity:.1f} requests/s; soaking at {args.load:.0%}: {rate:.1f} requests/s")
        else:
            rate = args.rate
        start = svc.processes()
        print(
            f"soak: {rate:.1f} requests/s × {args.texts} texts for {args.minutes:g} min; "
            f"{len(start.processes)} processes, {len(start.workers)} workers, PSS "
            f"{start.memory.pss / procs.MB:.1f} MB, RSS {start.memory.rss / procs.MB:.1f} MB"
        )
        windows, ok, errors, first_error, statuses = asyncio.run(
            _soak(svc, bodies, rate, args.minutes * 60, args.pool, args.window_s)
        )
        end = svc.processes()
    return SoakReport(
        model=str(model),
        capacity_rps=capacity,
        rate_rps=rate,
        minutes=args.minutes,
        texts_per_request=args.texts,
        memory=growth_by_process(start, end),
        requests=ok,
        errors=errors,
        first_error=first_error,
        status_counts=statuses,
        windows=windows,
    )


def _mb(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.1f}':>{width}}"


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
    lines += [
        "memory in MB; PSS splits each shared page among the processes that map it, so the rows add up to "
        "the tree; RSS (as top shows it) counts shared pages in every process; CPU s: used during the soak",
        f"{'process':<18}{'pid':>8}{'RSS start':>11}{'RSS end':>9}{'PSS start':>11}{'PSS end':>9}{'growth':>9}"
        f"{'CPU s':>8}",
    ]
    for g in report.memory:
        grew = "gone" if g.pss_end_mb is None else "new" if g.pss_start_mb is None else f"{g.growth:+.1%}"
        lines.append(
            f"{g.role:<18}{'' if g.pid is None else g.pid:>8}{_mb(g.rss_start_mb, 11)}{_mb(g.rss_end_mb, 9)}"
            f"{_mb(g.pss_start_mb, 11)}{_mb(g.pss_end_mb, 9)}{grew:>9}{_mb(g.cpu_s, 8)}"
        )
    verdict = "PASS" if report.ok else "FAIL"
    worst = max((w.growth for w in report.workers if w.growth is not None), default=None)
    lines.append(
        f"tree PSS {report.tree.pss_start_mb:.1f} MB → {report.tree.pss_end_mb:.1f} MB ({report.tree.growth:+.1%}), "
        f"{len(report.workers)} workers"
        + ("" if worst is None else f" (most growth {worst:+.1%})")
        + f", target < {GROWTH_TARGET:.0%} each, no worker gone or new; {report.requests} requests answered 200, "
        f"{report.errors} errors (target 0); statuses {report.status_counts}: {verdict}"
    )
    if report.first_error:
        lines.append(f"first error: {report.first_error}")
    return "\n".join(lines)


@contextmanager
def _model(args: argparse.Namespace) -> Iterator[Path]:
    if not args.quick:
        yield args.model
        return
    with quick_model() as (model, _source):
        yield model


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
    p.add_argument("--pool", type=int, default=64, help="client connections (the most requests in flight)")
    p.add_argument("--cache-bytes", type=int, default=0, help="ZHEMBED_CACHE_BYTES of the service")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="loadtest/results/soak-server.log", help="the server's output")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    p.add_argument("--quick", action="store_true", help="the tiny model, exported into a temp dir")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with _model(args) as model:
        report = run(args, model)
    print(render(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
