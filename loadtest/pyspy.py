"""Where the service's time goes under load: py-spy's samples, thread by thread, or its own stage timings.

    pip install py-spy
    python -m loadtest.pyspy [--model DIR] [--variant int8] [--concurrency 32] [--texts 1] [--seconds 15]
                             [--cache-hits] [--nonblocking] [--inclusive json_response,Service.embed]
    python -m loadtest.pyspy --stages [--model DIR] [--concurrency 1,32] [--seconds 10]

Per thread, its share of the samples and the frames where that time is spent (the leaf, then the nearest
Python frame with native leaves folded in); ``--inclusive`` adds named functions' share, callees
included. Raw stacks are kept under loadtest/results/ for a flame graph. ``--cache-hits`` (a cache
holding the bench's hit set, all the load asks for) implies ``--nonblocking`` (no pause, no native frames).

``--stages``: no py-spy; each concurrency in turn (after 2 s of warm-up), p50 / p90 of ``x-queue-time``,
``x-tokenization-time``, ``x-inference-time`` and ``x-total-time`` (ms), the stage times the service sends
with each answer, and of the client's latency (which adds HTTP and JSON).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import uvloop

from loadtest import loadgen
from loadtest.corpus import HIT_SET, load_corpus, request_bodies
from loadtest.harness import TWIN, parser
from loadtest.harness.report import RESULTS
from loadtest.harness.service import service_env
from loadtest.server import HOST, ServiceProcess

# The stage times the service sends with each answer (docs/api.md), in ms.
STAGES = ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time")


def _record(samples: dict[str, list[float]], head: bytes) -> None:
    """The stage times of one answer's headers, into ``samples``."""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() in samples:
            samples[name.strip().lower()].append(float(value))


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: each stack's frames (its thread first) and its samples."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(count)


def summarise(stacks: Path, top: int, python_leaf: bool) -> str:
    """Top ``top`` leaf frames per thread from py-spy's raw (collapsed) output."""
    per_thread: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for frames, count in _stacks(stacks):
        thread, leaf = frames[0], frames[-1]
        if python_leaf:
            leaf = next((f for f in reversed(frames[1:]) if ".py:" in f or ".py)" in f), leaf)
        per_thread[thread][leaf] += count
        total += count
    out: list[str] = []
    for thread, counts in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        out.append(f"{thread}: {n} samples, {n / total:.1%} of all")
        for frame, c in counts.most_common(top):
            out.append(f"    {c / total:6.1%}  {frame[:150]}")
    return "\n".join(out)


def inclusive_shares(stacks: Path, names: list[str]) -> str:
    """Each of ``names`` (functions, as py-spy names them): its share of its thread's samples, callees in."""
    per_thread: Counter[str] = Counter()
    hits: dict[tuple[str, str], int] = defaultdict(int)
    for frames, count in _stacks(stacks):
        per_thread[frames[0]] += count
        functions = {f.split(" (", 1)[0] for f in frames[1:]}  # py-spy's "name (file:line)"
        for name in names:
            if name in functions:
                hits[frames[0], name] += count
    out = []
    for (thread, name), count in sorted(hits.items(), key=lambda kv: -kv[1]):
        out.append(f"    {count / per_thread[thread]:6.1%}  {name}  (of {thread})")
    missing = [n for n in names if not any(n == name for _, name in hits)]
    if missing:
        out.append(f"    not sampled: {', '.join(missing)}")
    return "\n".join(out)


def stages(svc: ServiceProcess, make: loadgen.BodyFactory, levels: list[int], seconds: float) -> None:
    """``--stages``: a line per concurrency, p50 / p90 ms of each stage header and of the client's latency."""
    names = (*STAGES, "client")
    print(f"{'concurrency':>11} {'requests':>9}" + "".join(f"{h.removeprefix('x-'):>22}" for h in names))
    for concurrency in levels:
        samples: dict[str, list[float]] = {h: [] for h in STAGES}
        record = partial(_record, samples)
        load = loadgen.run_cell(HOST, svc.port, "/embed", make, concurrency, seconds, 2.0, answered=record)
        samples["client"] = uvloop.run(load).latencies_ms
        cells = "".join("{:>14.2f} / {:>5.1f}".format(*np.percentile(samples[h], (50, 90))) for h in names)
        print(f"{concurrency:>11} {len(samples['client']):>9}{cells}")


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.pyspy", __doc__, model=TWIN, seconds=None)
    p.add_argument("--variant", default="int8")
    p.add_argument("--concurrency", default=None, help="clients (default 32; --stages: each of 1,32)")
    p.add_argument("--texts", type=int, default=1)
    p.add_argument("--rate", type=int, default=250, help="samples per second")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--cache-hits", action="store_true", help="the bench cache row's 100%%-hit load")
    p.add_argument("--nonblocking", action="store_true", help="do not pause the service (no native frames)")
    p.add_argument("--inclusive", default="", help="comma-separated functions to report inclusively")
    p.add_argument("--stages", action="store_true", help="the stage timing headers instead of py-spy")
    args = p.parse_args(argv)
    nonblocking = args.nonblocking or args.cache_hits
    levels = [int(c) for c in (args.concurrency or ("1,32" if args.stages else "32")).split(",")]
    seconds = args.seconds or (10.0 if args.stages else 15.0)
    pyspy = "" if args.stages else shutil.which("py-spy")
    if pyspy is None:
        print("pyspy: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    admit = 2 * max(levels) * args.texts
    env = service_env(args.model, args.variant, admit, cache_bytes=64 * 2**20 if args.cache_hits else 0)
    stacks = RESULTS / f"pyspy-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    corpus = load_corpus()[:HIT_SET] if args.cache_hits else load_corpus()
    make = loadgen.cycle(request_bodies(corpus, args.texts), args.texts)
    with ServiceProcess("app", env, RESULTS / "logs" / "pyspy-service.log") as svc:
        if args.stages:
            print(f"p50 / p90 ms per stage, {args.texts} text(s) per request, {args.model}")
            stages(svc, make, levels, seconds)
            return 0
        load = partial(loadgen.run_cell, HOST, svc.port, "/embed", make, levels[0])
        uvloop.run(load(2.0, 0.0))  # warm
        sample = ["-p", str(svc.pid), "-d", str(int(seconds)), "-r", str(args.rate), "--threads"]
        mode = ["--nonblocking"] if nonblocking else ["--native"]
        command = [pyspy, "record", *sample, *mode, "-f", "raw", "-o", str(stacks)]
        record = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        result = uvloop.run(load(seconds + 1, 0.5))
        _, err = record.communicate(timeout=60)
        if record.returncode != 0:
            print(f"py-spy failed: {err.decode()[-2000:]}", file=sys.stderr)
            return 1
    print(
        f"load: c={levels[0]} x{args.texts}: {result.sentences_per_s:.1f} sentences/s, "
        f"p50 {result.percentile(50):.1f} ms, errors {result.errors} (while sampled"
        + (", nonblocking: Python frames only)" if nonblocking else ")")
    )
    print(f"\n== leaf frames (own time{'' if nonblocking else ', native included'}) ==")
    print(summarise(stacks, args.top, python_leaf=False))
    print("\n== nearest Python frame (own time of Python code, native folded in) ==")
    print(summarise(stacks, args.top, python_leaf=True))
    if args.inclusive:
        print("\n== inclusive share of the named functions ==")
        print(inclusive_shares(stacks, [n.strip() for n in args.inclusive.split(",") if n.strip()]))
    print(f"\nstacks: {stacks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
