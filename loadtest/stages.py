"""What a request costs at each stage, from the service's own timing headers.

    python -m loadtest.stages [--model models/bert-base-chinese-twin] [--concurrency 1,32] [--seconds 10]

Starts ``python -m app`` on the model (cache off, so every request is computed), sends one corpus
sentence per ``/embed`` request from N concurrent clients (:mod:`loadtest.loadgen`'s closed loop, after 2 s
of warm-up), and prints p50 / p90 of ``x-queue-time``, ``x-tokenization-time``, ``x-inference-time`` and
``x-total-time`` (ms) per concurrency, and of the client's latency (which adds HTTP and JSON).
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import uvloop

from loadtest import loadgen
from loadtest.corpus import load_corpus, request_bodies
from loadtest.harness import TWIN, parser
from loadtest.harness.service import service_env
from loadtest.server import HOST, ServiceProcess

HEADERS = ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time")


def _record(samples: dict[str, list[float]], head: bytes) -> None:
    """The stage times of one answer's headers, into ``samples``."""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() in samples:
            samples[name.strip().lower()].append(float(value))


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> None:
    p = parser("loadtest.stages", __doc__, model=TWIN, seconds=10.0)
    p.add_argument("--concurrency", default="1,32")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    env = service_env(args.model, "auto", max(levels))
    make = loadgen.cycle(request_bodies(load_corpus(), 1), 1)
    print(f"p50 / p90 ms per stage, one sentence per request, {args.model}")
    print(
        f"{'concurrency':>11} {'requests':>9}"
        + "".join(f"{h.removeprefix('x-'):>22}" for h in (*HEADERS, "client"))
    )
    with ServiceProcess("app", env, Path("/tmp/zhembed-stages.log")) as service:
        for concurrency in levels:
            samples: dict[str, list[float]] = {h: [] for h in HEADERS}
            record = functools.partial(_record, samples)
            load = loadgen.run_cell(
                HOST, service.port, "/embed", make, concurrency, args.seconds, 2.0, answered=record
            )
            samples["client"] = uvloop.run(load).latencies_ms
            cells = "".join(
                f"{_pct(samples[h], 50):>14.2f} / {_pct(samples[h], 90):>5.1f}" for h in (*HEADERS, "client")
            )
            print(f"{concurrency:>11} {len(samples['client']):>9}{cells}")


if __name__ == "__main__":
    main()
