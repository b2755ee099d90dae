"""What a request costs at each stage, from the service's own timing headers.

    python -m loadtest.stages [--model models/bert-base-chinese-twin] [--concurrency 1,32] [--seconds 10]

Starts ``python -m app`` on the model (cache off, so every request is computed), sends one corpus
sentence per ``/embed`` request from N concurrent clients, and prints p50 / p90 of ``x-queue-time``,
``x-tokenization-time``, ``x-inference-time`` and ``x-total-time`` (ms) per concurrency, plus the
client-side latency (which adds HTTP and JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from pathlib import Path

import httpx

from loadtest.corpus import load_corpus
from loadtest.server import HOST, ServiceProcess

HEADERS = ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time")


async def _drive(url: str, texts: list[str], concurrency: int, seconds: float) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {h: [] for h in (*HEADERS, "client")}
    cycle = itertools.cycle(texts)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                response = await client.post("/embed", json={"inputs": next(cycle)})
                response.raise_for_status()
                samples["client"].append((time.perf_counter() - start) * 1000)
                for h in HEADERS:
                    samples[h].append(float(response.headers[h]))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.stages", description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("models/bert-base-chinese-twin"))
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    env = {"ZHEMBED_MODEL": str(args.model), "ZHEMBED_CACHE_BYTES": "0"}
    texts = load_corpus()
    print(f"p50 / p90 ms per stage, one sentence per request, {args.model}")
    print(
        f"{'concurrency':>11} {'requests':>9}"
        + "".join(f"{h.removeprefix('x-'):>22}" for h in HEADERS)
        + f"{'client':>16}"
    )
    with ServiceProcess("app", env, Path("/tmp/zhembed-stages.log")) as service:
        url = f"http://{HOST}:{service.port}"
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            asyncio.run(_drive(url, texts, concurrency, 2.0))  # warm the connections and the batches
            samples = asyncio.run(_drive(url, texts, concurrency, args.seconds))
            cells = "".join(
                f"{_pct(samples[h], 50):>14.2f} / {_pct(samples[h], 90):>5.1f}" for h in (*HEADERS, "client")
            )
            print(f"{concurrency:>11} {len(samples['client']):>9}{cells}")


if __name__ == "__main__":
    main()
