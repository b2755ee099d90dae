"""Profile the service under load with py-spy and print the top frames by own time, thread by thread.

    pip install py-spy
    python -m loadtest.pyspy [--model DIR] [--variant int8] [--concurrency 32] [--texts 1] [--seconds 15]
                             [--cache-hits] [--nonblocking] [--inclusive json_response,Service.embed]

Per thread, its share of the samples and the frames where that time is spent (the leaf, then the nearest
Python frame with native leaves folded in); ``--inclusive`` adds named functions' share, callees
included. Raw stacks are kept under loadtest/results/ for a flame graph. ``--cache-hits`` (a cache
holding the bench's hit set, all the load asks for) implies ``--nonblocking`` (no pause, no native frames).
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

import uvloop

from loadtest import loadgen
from loadtest.corpus import HIT_SET, load_corpus, request_bodies
from loadtest.harness import TWIN, parser
from loadtest.harness.report import RESULTS
from loadtest.harness.service import service_env
from loadtest.server import HOST, ServiceProcess


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


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.pyspy", __doc__, model=TWIN, seconds=15.0)
    p.add_argument("--variant", default="int8")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--texts", type=int, default=1)
    p.add_argument("--rate", type=int, default=250, help="samples per second")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--cache-hits", action="store_true", help="the bench cache row's 100%%-hit load")
    p.add_argument("--nonblocking", action="store_true", help="do not pause the service (no native frames)")
    p.add_argument("--inclusive", default="", help="comma-separated functions to report inclusively")
    args = p.parse_args(argv)
    nonblocking = args.nonblocking or args.cache_hits
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        print("pyspy: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    admit = 2 * args.concurrency * args.texts
    env = service_env(args.model, args.variant, admit, cache_bytes=64 * 2**20 if args.cache_hits else 0)
    stacks = RESULTS / f"pyspy-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    corpus = load_corpus()[:HIT_SET] if args.cache_hits else load_corpus()
    make = loadgen.cycle(request_bodies(corpus, args.texts), args.texts)
    with ServiceProcess("app", env, RESULTS / "logs" / "pyspy-service.log") as svc:
        load = partial(loadgen.run_cell, HOST, svc.port, "/embed", make, args.concurrency)
        uvloop.run(load(2.0, 0.0))  # warm
        sample = ["-p", str(svc.pid), "-d", str(int(args.seconds)), "-r", str(args.rate), "--threads"]
        mode = ["--nonblocking"] if nonblocking else ["--native"]
        command = [pyspy, "record", *sample, *mode, "-f", "raw", "-o", str(stacks)]
        record = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        result = uvloop.run(load(args.seconds + 1, 0.5))
        _, err = record.communicate(timeout=60)
        if record.returncode != 0:
            print(f"py-spy failed: {err.decode()[-2000:]}", file=sys.stderr)
            return 1
    print(
        f"load: c={args.concurrency} x{args.texts}: {result.sentences_per_s:.1f} sentences/s, "
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
