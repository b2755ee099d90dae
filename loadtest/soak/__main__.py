"""Soak: hold 80% of measured capacity for N minutes and watch memory, latency and errors, with faults if
asked for.

    python -m loadtest.soak                           # the twin, capacity measured first, 10 minutes
    python -m loadtest.soak --rate 120 --minutes 30   # a fixed rate (requests/s), no measuring
    python -m loadtest.soak --quick --minutes 1       # the tiny model in a temp dir (a smoke run)
    ZHEMBED_WORKERS=2 python -m loadtest.soak --minutes 60 --faults default --worker-max-memory-mb 300

Prints a row per window (requests, errors, p50/p90/p99/max, the PSS of the process tree and of each
worker), then per process and for the tree RSS, PSS at the start, the baseline and the end, growth and
CPU seconds; with ``--faults`` a table of every request by the fault it met and its fate. Targets: PSS
growth under 5% (tree and each worker), no worker gone or new, zero errors; with faults, none lost but
those in flight on the killed worker and the service exiting 0. ``--json`` writes the same as JSON.
docs/performance.md says how capacity, latency and memory are measured.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path

from loadtest import loadgen, procs
from loadtest.corpus import load_corpus, request_bodies
from loadtest.harness import parser
from loadtest.harness.cell import Cell, distinct_bodies
from loadtest.harness.measure import measure
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.server import ServiceProcess
from loadtest.soak import faults
from loadtest.soak.faults import Fault, FaultSpecError
from loadtest.soak.open_loop import OpenLoop
from loadtest.soak.report import SoakReport, growth_by_process, render


def soak_bodies(corpus: list[str], texts: int, seed: int, unique: bool) -> loadgen.BodyFactory:
    """``/embed`` bodies: the corpus's, round and round, or (``unique``) distinct texts each time, numbered
    corpus sentences, so that a cache never answers one for another; one count for every caller (the
    capacity run and the soak), so never the same text twice."""
    if not unique:
        return loadgen.cycle(request_bodies(corpus, texts, seed), texts)
    shuffled = corpus[:]
    random.Random(seed).shuffle(shuffled)
    distinct, sent = distinct_bodies(shuffled, texts, 0), itertools.count()
    return lambda _n: distinct(next(sent))


def measure_capacity(svc: ServiceProcess, bodies: loadgen.BodyFactory, cell: Cell, seconds: float) -> float:
    """Requests/s answered 200 by ``cell``'s closed-loop clients."""
    load = measure(svc, cell, bodies, seconds, min(5.0, seconds / 2), check=None, metrics=False).load
    if load.errors:
        print(f"  capacity run: {load.errors} errors (first: {load.first_error})", file=sys.stderr)
    return load.requests_per_s


def run(args: argparse.Namespace, model: Path) -> SoakReport:
    seconds = args.minutes * 60
    schedule = faults.parse_faults(args.faults, seconds, args.worker_max_memory_mb is not None)
    bodies = soak_bodies(load_corpus(), args.texts, args.seed, unique=bool(schedule))
    bound = args.worker_max_memory_mb if any(f.kind == faults.BOUND for f in schedule) else None
    redis = faults.RedisServer(args.redis_server, args.redis_max_memory_mb) if schedule else None
    more = {"cache_bytes": args.cache_bytes, "worker_max_memory_mb": bound, "redis_url": redis and redis.url}
    env = service_env(model, args.variant, args.pool * args.texts, **more)
    if redis is not None:
        redis.start()
    log = Path(args.log)
    try:
        with ServiceProcess("app", env, log) as svc:
            capacity = None
            if args.rate is None:
                print(
                    f"measuring capacity: {args.capacity_concurrency} closed-loop clients, {args.capacity_s:.0f} s"
                )
                capacity = measure_capacity(
                    svc, bodies, Cell(args.capacity_concurrency, args.texts), args.capacity_s
                )
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
            soak = OpenLoop(svc, bodies, rate, seconds, args, schedule, redis, start)
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
        notes=soak.notes,
    )


def _fault_text(f: Fault) -> str:
    return f.kind if f.at_s is None else f"{f.kind} at {f.at_s:.0f} s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser("loadtest.soak", __doc__)
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
        help="ZHEMBED_WORKER_MAX_MEMORY_MB of the service, for the bound fault: a worker's PSS at which it is replaced",
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
