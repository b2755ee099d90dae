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
4. Each minute (``--window-s``): requests, errors, p50/p90/p99/max latency and the server's RSS. At the
   end: RSS at the start of the soak and at the end, growth in percent, errors, and whether the targets
   were met (RSS growth under 5%, zero errors). ``--json`` writes the same as a JSON file.

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

from loadtest import loadgen
from loadtest.corpus import load_corpus, request_bodies
from loadtest.quick_model import quick_model
from loadtest.server import HOST, ServiceProcess

RSS_GROWTH_TARGET = 0.05


@dataclass
class Window:
    start_s: float  # seconds into the soak
    requests: int
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    rss_mb: float
    late_starts: int  # requests sent over 100 ms after their slot: the client pool was exhausted


@dataclass
class SoakReport:
    model: str
    capacity_rps: float | None
    rate_rps: float
    minutes: float
    texts_per_request: int
    rss_start_mb: float
    rss_end_mb: float
    rss_growth: float
    requests: int
    errors: int
    first_error: str | None
    status_counts: dict[int, int]
    windows: list[Window] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.errors == 0 and self.rss_growth < RSS_GROWTH_TARGET


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
    rss: dict[int, float] = {}

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

    async def sample_rss() -> None:
        while time.perf_counter() < end:
            rss[bucket(time.perf_counter())] = svc.rss_bytes() / 2**20
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_rss())
    await asyncio.gather(*(worker() for _ in range(pool)))
    await sampler
    windows = []
    for m in range(int(np.ceil(seconds / window_s))):
        lat = np.array(buckets.get(m, [float("nan")]))
        windows.append(
            Window(
                start_s=m * window_s,
                requests=len(buckets.get(m, [])),
                errors=errors.get(m, 0),
                p50_ms=float(np.percentile(lat, 50)),
                p90_ms=float(np.percentile(lat, 90)),
                p99_ms=float(np.percentile(lat, 99)),
                max_ms=float(np.max(lat)),
                rss_mb=rss.get(m, float("nan")),
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
        rss_start = svc.rss_bytes() / 2**20
        print(
            f"soak: {rate:.1f} requests/s × {args.texts} texts for {args.minutes:g} min; RSS {rss_start:.1f} MB"
        )
        windows, ok, errors, first_error, statuses = asyncio.run(
            _soak(svc, bodies, rate, args.minutes * 60, args.pool, args.window_s)
        )
        rss_end = svc.rss_bytes() / 2**20
    return SoakReport(
        model=str(model),
        capacity_rps=capacity,
        rate_rps=rate,
        minutes=args.minutes,
        texts_per_request=args.texts,
        rss_start_mb=rss_start,
        rss_end_mb=rss_end,
        rss_growth=(rss_end - rss_start) / rss_start,
        requests=ok,
        errors=errors,
        first_error=first_error,
        status_counts=statuses,
        windows=windows,
    )


def render(report: SoakReport) -> str:
    lines = [
        f"{'from s':>6} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'RSS MB':>8} {'late':>5}"
    ]
    for m in report.windows:
        lines.append(
            f"{m.start_s:>6.0f} {m.requests:>9} {m.errors:>7} {m.p50_ms:>8.1f} {m.p90_ms:>8.1f} {m.p99_ms:>8.1f} "
            f"{m.max_ms:>8.1f} {m.rss_mb:>8.1f} {m.late_starts:>5}"
        )
    verdict = "PASS" if report.ok else "FAIL"
    lines.append(
        f"RSS {report.rss_start_mb:.1f} MB → {report.rss_end_mb:.1f} MB ({report.rss_growth:+.1%}, target "
        f"< {RSS_GROWTH_TARGET:.0%}); {report.requests} requests answered 200, {report.errors} errors "
        f"(target 0); statuses {report.status_counts}: {verdict}"
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
