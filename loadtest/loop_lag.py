"""The event loop under each route's heaviest request: /health's latency on the same worker while it runs.

    python -m loadtest.loop_lag [--model models/bert-base-chinese-twin] [--variant int8] [--seconds 10]
                                [--tree PATH] [--quick]

One worker serves. Each row of :data:`ROUTES` (a route, what its request holds, its body for the model's
sequence length) is one cell: the request is sent back to back for ``--seconds`` (the last one is waited
for) while another connection sends ``GET /health`` every 10 ms; the table gives /health's p50, p99 and
largest latency over the probes sent while the heavy request was in flight, the heavy requests answered
(and their statuses), and the samples of ``zhembed_event_loop_lag_seconds`` above 50 ms in the cell (none
where the service has no such metric). Issue 50's bar: /health p99 ≤ 50 ms on every row. ``--tree``
starts the service from another checkout (the code before a change) with this harness; ``--quick`` runs
the tiny model (128 tokens a sequence, hidden 64). A route is added by one line in :data:`ROUTES`.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness import TWIN, parser
from loadtest.harness.service import service_env
from loadtest.quick_model import tiny_model
from loadtest.server import HOST, ServiceProcess

PROBE_EVERY_S = 0.01
LAG_SERIES = "zhembed_event_loop_lag_seconds_bucket"


@dataclass(frozen=True)
class Heavy:
    """One row: ``route``'s heaviest request within the limits; ``body(n)`` for a model of ``n`` tokens a
    sequence, [CLS] and [SEP] included."""

    route: str
    what: str
    body: Callable[[int], Any]


def full(n: int, char: str = "北") -> str:
    """A text of one full sequence of a model of ``n`` tokens."""
    return char * (n - 2)


def masked(n: int) -> str:
    """8 characters and 128 [MASK] (the most a request may hold), fewer where ``n`` tokens cannot hold them."""
    return "北京是中国的首都" + "[MASK]" * min(128, n - 10)


ROUTES = [
    Heavy("/health", "(nothing else running)", lambda n: None),
    Heavy("/fill-mask", "8 chars + 128 [MASK], top_k 50", lambda n: {"inputs": masked(n), "top_k": 50}),
    Heavy("/tokenize", "64 inputs, 65,536 tokens", lambda n: {"inputs": ["北" * 1022] * 64}),
    Heavy("/embed_all", "~4,096 token vectors, float", lambda n: {"inputs": [full(n)] * (4096 // n)}),
    Heavy("/embed", "64 full sequences", lambda n: {"inputs": [full(n)] * 64}),
    Heavy(
        "/similarity",
        "1 + 63 full sequences",
        lambda n: {"inputs": {"source_sentence": full(n), "sentences": [full(n, "京")] * 63}},
    ),
    Heavy(
        "/v1/embeddings",
        "64 full sequences, base64",
        lambda n: {"input": [full(n)] * 64, "encoding_format": "base64"},
    ),
]


@dataclass
class Cell:
    route: str
    what: str
    health_ms: list[float]
    statuses: dict[int, int]
    lag_over_50ms: float | None


def lag_samples_over(metrics: str, bound: float = 0.05) -> float | None:
    """Lag samples above ``bound`` seconds on a /metrics text (the cumulative +Inf count less the count at
    the first bucket at or above ``bound``); None without the metric."""
    total = at_bound = None
    for line in metrics.splitlines():
        if not line.startswith(LAG_SERIES):
            continue
        le, value = line.split('le="', 1)[1].split('"', 1)[0], float(line.rpartition(" ")[2])
        if le == "+Inf":
            total = value
        elif at_bound is None and float(le) >= bound:
            at_bound = value
    return None if total is None or at_bound is None else total - at_bound


def run_cell(port: int, heavy: Heavy, tokens: int, seconds: float) -> Cell:
    """``heavy``'s request back to back for ``seconds`` while /health is probed."""
    url = f"http://{HOST}:{port}"
    body = heavy.body(tokens)
    in_flight = threading.Event()
    done = threading.Event()
    health: list[float] = []
    statuses: dict[int, int] = {}

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.get("/health").raise_for_status()
                took = time.perf_counter() - started
                if in_flight.is_set() or body is None:
                    health.append(took * 1000)
                time.sleep(PROBE_EVERY_S)

    def load() -> None:
        deadline = time.monotonic() + seconds
        with httpx.Client(base_url=url, timeout=None) as client:
            while time.monotonic() < deadline:
                if body is None:
                    time.sleep(0.1)
                    continue
                in_flight.set()
                status = client.post(heavy.route, json=body).status_code
                in_flight.clear()
                statuses[status] = statuses.get(status, 0) + 1

    before = httpx.get(url + "/metrics").text
    with ThreadPoolExecutor(2) as pool:
        probing = pool.submit(probe)
        pool.submit(load).result()
        done.set()
        probing.result()
    after_count = lag_samples_over(httpx.get(url + "/metrics").text)
    before_count = lag_samples_over(before)
    lag = None if after_count is None or before_count is None else after_count - before_count
    return Cell(heavy.route, heavy.what, health, statuses, lag)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def table(cells: list[Cell]) -> str:
    head = "| route | heaviest request | /health probes | p50 ms | p99 ms | max ms | heavy answered | lag > 50 ms |"
    rows = [head, "|---|---|---:|---:|---:|---:|---|---:|"]
    for c in cells:
        answered = ", ".join(f"{n}× {s}" for s, n in sorted(c.statuses.items())) or "—"
        lag = "—" if c.lag_over_50ms is None else f"{c.lag_over_50ms:.0f}"
        rows.append(
            f"| {c.route} | {c.what} | {len(c.health_ms)} | {statistics.median(c.health_ms):.1f} | "
            f"{percentile(c.health_ms, 0.99):.1f} | {max(c.health_ms):.1f} | {answered} | {lag} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = parser("loadtest.loop_lag", __doc__, quick="the tiny model (exported into a temp dir)", model=TWIN)
    p.add_argument("--variant", default="int8")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of heavy requests per row")
    p.add_argument("--tree", type=Path, default=None, help="the checkout whose service runs (default: this)")
    p.add_argument("--routes", default="", help="comma-separated routes to run (default: every row)")
    args = p.parse_args()
    wanted = set(filter(None, args.routes.split(",")))
    with ExitStack() as stack:
        model = stack.enter_context(tiny_model()) if args.quick else args.model
        variant = "fp32" if args.quick else args.variant
        env = service_env(model, variant, 512, workers=1, warmup=False)
        log = Path("/tmp") / f"zhembed-loop-lag-{time.time_ns()}.log"
        service = stack.enter_context(ServiceProcess("app", env, log, cwd=args.tree))
        tokens = int(httpx.get(f"http://{HOST}:{service.port}/info").json()["max_input_length"])
        cells = []
        for heavy in ROUTES:
            if wanted and heavy.route not in wanted:
                continue
            cells.append(run_cell(service.port, heavy, tokens, args.seconds))
            print(table(cells[-1:]).splitlines()[-1], flush=True)
    print(f"\n{args.tree or 'this tree'}, {'tiny model' if args.quick else model} ({variant}), one worker:")
    print(table(cells))


if __name__ == "__main__":
    main()
