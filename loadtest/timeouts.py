"""Clients that give up: many clients with a short timeout against a saturated worker (issue 50).

    python -m loadtest.timeouts [--model DIR] [--clients 512] [--timeout 1.0] [--hold 3] [--tail 1]
                                [--limit 64]

A server on the tiny model (or ``--model DIR``) runs in this process with ``max_concurrent_inputs`` at
``--limit``, its tokeniser and inference held shut (saturated: what it admits waits) until clients have
given up on it and then for ``--hold`` seconds more (or three waves of give-ups), and let go for
``--tail`` seconds, while ``--clients`` clients in one event loop send ``POST /embed`` (one text, or four
every fourth time): each gives up on a request after ``--timeout`` seconds (closing its connection, so the
server cancels the request) and sends the next at once, and waits Retry-After after a 429. The promise
under test: every answer is 200, 429 or 503 (never a 500: a permit lives as long as its work), and
afterwards the worker is healthy with nothing in flight and nothing queued. Prints a table of what the
clients got; exits 1 when the promise is broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ALLOWED = {"200", "429", "503"}
TIMEOUT = "timeout"  # the client gave up: no status
# Waves of clients giving up the worker is held through, at most: the tokenisation thread may take the
# first wave's texts into its own (held) call, the second fills its queue, the third finds it full.
WAVES = 3


async def storm(
    url: str,
    clients: int,
    timeout_s: float,
    until: asyncio.Event,
    seen: Counter[str],
    retry_after_s: float = 1.0,
    big_every: int = 4,
) -> None:
    """``clients`` concurrent clients send ``POST /embed`` to ``url`` until ``until`` is set, each answer
    counted in ``seen`` by status code (as text), or :data:`TIMEOUT`. The clients' own behaviour sets the
    pace, not the server's speed: a timeout is followed by the next request, a 429 by ``retry_after_s``.
    A request holds one text, or four every ``big_every``-th time (0: never)."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(index: int, c: httpx.AsyncClient) -> None:
        for j in itertools.count():
            if until.is_set():
                return
            size = 4 if big_every and (index + j) % big_every == 0 else 1  # mostly a queue entry per permit
            texts = [f"客户 {index} 第 {j} 次 第 {k} 句" for k in range(size)]
            try:
                response = await c.post("/embed", json={"inputs": texts}, timeout=timeout_s)
            except httpx.TimeoutException:
                seen[TIMEOUT] += 1
                continue
            seen[str(response.status_code)] += 1
            if response.status_code == 429:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), retry_after_s)

    async with httpx.AsyncClient(base_url=url, limits=limits) as c:
        await asyncio.gather(*(client(i, c) for i in range(clients)))


@dataclass
class After:
    """The worker once the clients have gone."""

    health: int  # GET /health's status
    in_flight: int  # permits still taken (admission's count)
    queued: int  # sequences in the batch queue plus texts waiting to be tokenised
    answer: int  # a plain /embed's status


def after(url: str, service: Any, settle_s: float = 30.0) -> After:
    """The worker's state once its work has drained (given ``settle_s`` to, then read as it is)."""
    engine = service.engine
    deadline = time.monotonic() + settle_s
    while engine.admission.in_use and time.monotonic() < deadline:
        time.sleep(0.02)
    with httpx.Client(base_url=url, timeout=60) as c:
        return After(
            c.get("/health").status_code,
            engine.admission.in_use,
            engine.batcher.depth + engine.tokenization.pending_texts,
            c.post("/embed", json={"inputs": ["之后"]}).status_code,
        )


def hold(service: Any, gate: threading.Event) -> Callable[[], None]:
    """Make the tokeniser's calls and the model's batches wait for ``gate``; the undo."""
    tokenizer, model = service.engine.tokenization.tokenizer, service.model
    encode_batch, encode = tokenizer.encode_batch, model.encode

    def gated(run: Callable[..., Any]) -> Callable[..., Any]:
        def wait_then(*args: Any, **kwargs: Any) -> Any:
            gate.wait(timeout=120)
            return run(*args, **kwargs)

        return wait_then

    tokenizer.encode_batch, model.encode = gated(encode_batch), gated(encode)

    def undo() -> None:
        tokenizer.encode_batch, model.encode = encode_batch, encode

    return undo


@contextmanager
def serving(model: Path, limit: int) -> Iterator[tuple[str, Any]]:
    """The service on ``model`` in this process (uvicorn on a thread, a free port): its URL and service."""
    import uvicorn

    from app.serving.factory import create_app
    from app.settings import Settings

    settings = Settings(
        model=str(model), max_concurrent_inputs=limit, warmup=False, cache_bytes=0, intra_op_threads=1
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not (server.started and getattr(app.state, "service", None) and app.state.service.ready):
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the server did not get ready")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", app.state.service
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def run(
    url: str, service: Any, clients: int, timeout_s: float, hold_s: float, tail_s: float, big_every: int = 4
) -> tuple[Counter[str], After]:
    """The storm against a worker held shut until clients have given up on it and sent more for
    ``hold_s`` (or until :data:`WAVES` waves of them gave up: only a worker that gives permits back too
    early admits more than one), then let go for ``tail_s``; and what the worker looks like after it."""
    gate = threading.Event()
    undo = hold(service, gate)
    seen: Counter[str] = Counter()

    waves = WAVES * service.engine.admission.limit  # timeouts of that many full waves of one text each

    async def control(until: asyncio.Event) -> None:
        while not seen[TIMEOUT]:  # held until clients gave up on what it admitted
            await asyncio.sleep(0.01)
        opens = time.monotonic() + hold_s
        while seen[TIMEOUT] < waves and time.monotonic() < opens:  # while they send more
            await asyncio.sleep(0.01)
        gate.set()
        let_go = time.monotonic()
        # At least ``tail_s`` of the worker let go, and until it has answered one 200 (on a slow machine
        # the first may take longer than the tail): what comes after the hold is part of the run.
        while time.monotonic() - let_go < tail_s or (not seen["200"] and time.monotonic() - let_go < 60):
            await asyncio.sleep(0.01)
        until.set()

    async def scenario() -> None:
        until = asyncio.Event()
        await asyncio.gather(storm(url, clients, timeout_s, until, seen, big_every=big_every), control(until))

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
        undo()
    return seen, after(url, service)


def table(seen: Counter[str], state: After) -> str:
    rows = [f"{'answer':<10} {'count':>7}"]
    rows += [f"{status:<10} {count:>7}" for status, count in sorted(seen.items())]
    rows += [
        f"/health after: {state.health}; in flight after: {state.in_flight}; queued after: {state.queued}; "
        f"an /embed after: {state.answer}"
    ]
    return "\n".join(rows)


def broken(seen: Counter[str], state: After) -> list[str]:
    """What of the promise failed (empty: kept)."""
    problems = [f"{n} answers {s}" for s, n in sorted(seen.items()) if s not in ALLOWED | {TIMEOUT}]
    if state.health != 200 or state.answer != 200:
        problems.append(f"unhealthy after: /health {state.health}, /embed {state.answer}")
    if state.in_flight or state.queued:
        problems.append(f"left after: {state.in_flight} permits, {state.queued} queued")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="an exported model folder (default: the tiny model)")
    parser.add_argument("--clients", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=1.0, help="each client's timeout, seconds")
    parser.add_argument(
        "--hold", type=float, default=3.0, help="seconds the worker stays shut after the first timeout"
    )
    parser.add_argument("--tail", type=float, default=1.0, help="seconds the clients keep sending after")
    parser.add_argument("--limit", type=int, default=64, help="max_concurrent_inputs")
    args = parser.parse_args(argv)
    from loadtest.quick_model import tiny_model

    with tiny_model(args.model) as model, serving(model, args.limit) as (url, service):
        started = time.monotonic()
        seen, state = run(url, service, args.clients, args.timeout, args.hold, args.tail)
        took = time.monotonic() - started
    print(f"{args.clients} clients, {args.timeout:g} s timeout, limit {args.limit}")
    print(table(seen, state))
    print(f"({took:.1f} s)")
    problems = broken(seen, state)
    for problem in problems:
        print("BROKEN:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
