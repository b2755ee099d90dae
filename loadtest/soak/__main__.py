"""Soak: hold 80% of measured capacity for N minutes and watch memory, latency and errors, with faults if
asked for.

    python -m loadtest.soak                           # the twin, capacity measured first, 10 minutes
    python -m loadtest.soak --rate 120 --minutes 30   # a fixed rate (requests/s), no measuring
    python -m loadtest.soak --quick --minutes 1       # the tiny model in a temp dir (a smoke run)
    ZHEMBED_WORKERS=2 python -m loadtest.soak --minutes 60 --faults default --worker-max-memory-mb 300

Prints latency, errors and memory (PSS of the tree and each worker) per window, then each process's RSS,
PSS and CPU over the soak; with ``--faults`` (and a SIGTERM at the end) every request by the fault it met
and its fate. Targets: PSS growth under 5% (the tree and each worker), no worker gone or new, no request
lost but those in flight on a killed worker, the service exiting 0. docs/performance-log.md has the method.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

from loadtest import loadgen, procs
from loadtest.corpus import load_corpus, request_bodies
from loadtest.harness import parser
from loadtest.harness.cell import Cell, distinct_bodies
from loadtest.harness.measure import measure
from loadtest.harness.report import write_json
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.server import RedisServer, ServiceProcess
from loadtest.soak import faults
from loadtest.soak.faults import FaultSpecError, parse_faults
from loadtest.soak.open_loop import OpenLoop
from loadtest.soak.report import SoakReport, growth_by_process, render


def soak_bodies(corpus: list[str], texts: int, seed: int, unique: bool) -> loadgen.BodyFactory:
    """``/embed`` bodies: the corpus's, round and round, or (``unique``) numbered corpus sentences, never the
    same text twice across every caller (the capacity run and the soak), so that no cache answers one."""
    if not unique:
        return loadgen.cycle(request_bodies(corpus, texts, seed), texts)
    distinct = distinct_bodies(random.Random(seed).sample(corpus, len(corpus)), texts, 0)
    sent = itertools.count()
    return lambda _n: distinct(next(sent))


def measure_capacity(svc: ServiceProcess, bodies: loadgen.BodyFactory, args: argparse.Namespace) -> float:
    """Requests/s answered 200 to ``--capacity-concurrency`` closed-loop clients over ``--capacity-s``."""
    print(f"measuring capacity: {args.capacity_concurrency} closed-loop clients, {args.capacity_s:.0f} s")
    cell, seconds = Cell(args.capacity_concurrency, args.texts), args.capacity_s
    load = measure(svc, cell, bodies, seconds, min(5.0, seconds / 2), check=None, metrics=False).load
    if load.errors:
        print(f"  capacity run: {load.errors} errors (first: {load.first_error})", file=sys.stderr)
    rps = load.requests_per_s
    print(f"  capacity {rps:.1f} requests/s; soaking at {args.load:.0%}: {args.load * rps:.1f} requests/s")
    return rps


def run(args: argparse.Namespace, model: Path) -> SoakReport:
    """Measure capacity (unless ``--rate``), then hold the open loop with its faults; the report."""
    schedule: list[faults.Fault] = args.schedule
    bodies = soak_bodies(load_corpus(), args.texts, args.seed, unique=bool(schedule))
    bound = args.worker_max_memory_mb if any(f.kind == faults.BOUND for f in schedule) else None
    # Bounded, evicting the oldest: the soak's texts are all distinct, and Redis is outside the tree whose
    # memory the soak reads.
    redis = RedisServer(args.redis_server, args.redis_max_memory_mb) if schedule else None
    more = {"cache_bytes": args.cache_bytes, "worker_max_memory_mb": bound, "redis_url": redis and redis.url}
    env = service_env(model, args.variant, args.pool * args.texts, **more)
    try:
        if redis is not None:
            redis.start()
        with ServiceProcess("app", env, Path(args.log)) as svc:
            capacity = None if args.rate is not None else measure_capacity(svc, bodies, args)
            rate = args.rate if capacity is None else args.load * capacity
            soak = OpenLoop(svc, bodies, rate, args, redis)
            start = soak.first
            if any(f.kind == faults.KILL for f in schedule) and len(start.workers) < 2:
                raise SystemExit("the kill fault needs 2 workers or more (ZHEMBED_WORKERS=2)")
            timed = ", ".join(f.kind if f.at_s is None else f"{f.kind} at {f.at_s:.0f} s" for f in schedule)
            print(
                f"soak: {rate:.1f} requests/s × {args.texts} texts for {args.minutes:g} min; "
                f"{len(start.processes)} processes, {len(start.workers)} workers, PSS "
                f"{start.memory.pss / procs.MB:.1f} MB, RSS {start.memory.rss / procs.MB:.1f} MB"
                + (f"; faults {timed}" if schedule else "")
            )
            asyncio.run(soak.run())
    finally:
        if redis is not None:
            redis.stop()
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
        status_counts=dict(soak.statuses),
        windows=soak.windows(),
        retried=sum(c.retried for c in soak.conns),
        reopened=sum(c.reopened for c in soak.conns),
        faults=soak.events,
        fates=faults.fate_table(soak.requests, soak.events, args.settle_s),
        exit_code=soak.exit_code,
        replacements=soak.replacements,
        notes=soak.notes,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser("loadtest.soak", __doc__)
    p.add_argument("--model", type=Path, default=Path("models/bert-base-chinese-twin"))
    p.add_argument("--variant", default="int8", help="ZHEMBED_VARIANT of the service")
    p.add_argument("--minutes", type=float, default=10.0, help="how long to hold the load")
    p.add_argument("--rate", type=float, help="requests/s to hold; default --load × capacity")
    p.add_argument("--load", type=float, default=0.8, help="share of measured capacity to hold")
    p.add_argument("--capacity-s", type=float, default=20.0, help="seconds of the capacity measurement")
    p.add_argument("--capacity-concurrency", type=int, default=32)
    p.add_argument("--texts", type=int, default=4, help="texts per request")
    p.add_argument("--window-s", type=float, default=60.0, help="seconds per row of the latency table")
    p.add_argument("--baseline-minute", type=float, default=10.0, help="the minute growth is measured from")
    p.add_argument("--pool", type=int, default=64, help="client connections (the most requests in flight)")
    p.add_argument("--cache-bytes", type=int, default=0, help="ZHEMBED_CACHE_BYTES of the service")
    p.add_argument("--faults", default="", help="kill@T,redis@T,bound (T: 90s, 12m, 25%%) or 'default'")
    p.add_argument("--redis-down-s", type=float, default=30.0, help="how long the redis fault lasts")
    p.add_argument("--settle-s", type=float, default=10.0, help="how long a fault's window outlasts it")
    p.add_argument("--worker-max-memory-mb", type=int, help="the bound fault's ZHEMBED_WORKER_MAX_MEMORY_MB")
    p.add_argument("--redis-server", default="redis-server", help="the redis-server the faults start")
    p.add_argument("--redis-max-memory-mb", type=int, default=128, help="that Redis's maxmemory (LRU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="loadtest/results/soak-server.log", help="the server's output")
    p.add_argument("--json", type=Path, help="also write the report here")
    p.add_argument("--quick", action="store_true", help="the tiny model, exported into a temp dir")
    args = p.parse_args(argv)
    try:
        args.schedule = parse_faults(args.faults, args.minutes * 60, args.worker_max_memory_mb is not None)
    except FaultSpecError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tiny_model(None, ("fp32", "int8"), 3) if args.quick else nullcontext(args.model) as model:
        report = run(args, model)
    if args.json is not None:
        write_json(asdict(report), args.json, "soak")
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
