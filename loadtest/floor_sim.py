"""Background's floor on a simulated clock: the real batch queue under closed-loop clients, no machine noise.

    python -m loadtest.floor_sim [--model DIR] [--costs 8.1,0,1.33,0] [--background 64x32] [--seconds 120]

Interactive clients (``--clients``, one text each, u=3) and background clients (``--background`` clients x
texts, u=7) send their next request the moment an answer comes. Whenever the engine is free the real
:class:`app.engine.batching.Batcher`, on a one-lane scheduler as an engine's (whichever tree is on
``PYTHONPATH``: run it once on each to compare policies), cuts the next batch, which takes what the cost model (``a,b,c,d`` in ms) says. Prints, for the
interactive load alone and beside the background: the interactive p50 / p99 and sentences/s; beside it,
the background's whole requests finished, its inputs/s, and its share of the modelled time in useful work
(what its inputs cost in full batches: what ``background_share`` holds to).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

import numpy as np

from app.engine.costs import CostModel
from app.engine.work import Job, Need, Seq
from app.telemetry.metrics import Metrics
from loadtest.corpus import encode, load_corpus, tokenizer_of, unique_texts
from loadtest.harness import TWIN, parser
from loadtest.harness.cell import parse_cells
from tests.app.engine.fake_clock import FakeClock
from tests.app.engine.one_lane import OneLane

NEED = Need(layers=(1,), pooling="cls")


@dataclass(frozen=True)
class Outcome:
    """What one simulated run gave (times in seconds)."""

    p50: float
    p99: float
    interactive_per_s: float
    background_done: int
    background_per_s: float
    background_share: float


def simulate(
    model: CostModel,
    lengths: np.ndarray,
    clients: int,
    background: tuple[int, int],
    seconds: float,
    size: int = 8,
) -> Outcome:
    """``clients`` interactive clients beside ``background`` (clients, texts) for ``seconds`` simulated."""
    rng = np.random.default_rng(0)
    loop = asyncio.new_event_loop()
    clock = FakeClock()
    queue = OneLane(4096, size, 2.0, 1_000_000, Metrics(), lambda: False, costs=model, clock=clock)
    left: dict[int, int] = {}  # job id -> sequences not yet run
    started: dict[int, float] = {}

    def send(urgency: int, texts: int) -> None:
        job = Job(loop, texts)
        job.urgency = urgency
        picked = rng.choice(lengths, texts)
        queue.submit(
            [Seq(np.zeros(int(n), np.int64), NEED, job, i, clock.now()) for i, n in enumerate(picked)]
        )
        left[id(job)], started[id(job)] = texts, clock.now()

    for _ in range(clients):
        send(3, 1)
    for _ in range(background[0]):
        send(7, background[1])
    latencies: list[float] = []
    done = served = 0
    worth = total = 0.0
    end = clock.now() + seconds
    while clock.now() < end:
        batch = queue.next_batch()
        assert batch is not None
        cost = model.cost(len(batch), max(s.length for s in batch))
        clock.advance(cost)
        total += cost
        mine = np.array([s.length for s in batch if s.job.urgency == 7], dtype=np.int64)
        served += len(mine)
        worth += float(queue.planner.worth(mine).sum()) if len(mine) else 0.0
        for s in batch:
            key = id(s.job)
            left[key] -= 1
            if left[key]:
                continue
            del left[key]
            if s.job.urgency == 7:
                done += 1
                started.pop(key)
                send(7, background[1])
            else:
                latencies.append(clock.now() - started.pop(key))
                send(3, 1)
    loop.close()
    kept = np.array(latencies[len(latencies) // 10 :])  # the first tenth: the clients falling into step
    return Outcome(
        float(np.percentile(kept, 50)),
        float(np.percentile(kept, 99)),
        len(latencies) / seconds,
        done,
        served / seconds,
        worth / total,
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.floor_sim", __doc__, model=TWIN)  # whose tokenizer counts the tokens
    p.add_argument("--costs", default="8.1,0,1.33,0", help="a,b,c,d in ms (default: 2 AVX2 cores)")
    p.add_argument("--clients", type=int, default=8, help="interactive clients, one text each")
    p.add_argument("--background", type=parse_cells, default="64x32", help="clients x texts, at u=7")
    p.add_argument("--seconds", type=float, default=120.0, help="simulated seconds of each run")
    p.add_argument("--size", type=int, default=8, help="max_batch_size")
    args = p.parse_args(argv)
    a, b, c, d = (float(x) / 1000 for x in args.costs.split(","))
    model = CostModel(a, b, c, d)
    texts = unique_texts(load_corpus(), 0, 2000)
    lengths = np.array([len(x) for x in encode(tokenizer_of(args.model), texts)])
    (bg,) = args.background
    alone = simulate(model, lengths, args.clients, (0, 1), args.seconds, args.size)
    mixed = simulate(model, lengths, args.clients, (bg.clients, bg.texts), args.seconds, args.size)
    print(
        f"{args.clients} x 1 interactive, background {bg.clients} x {bg.texts} at u=7, cost {args.costs} ms"
    )
    print("| interactive | p50 ms | p99 ms | sentences/s | background requests | inputs/s | share of time |")
    print("|---|---|---|---|---|---|---|")
    for name, o in (("alone", alone), ("beside background", mixed)):
        print(
            f"| {name} | {o.p50 * 1000:.0f} | {o.p99 * 1000:.0f} | {o.interactive_per_s:.1f} | "
            f"{o.background_done} | {o.background_per_s:.1f} | {o.background_share:.3f} |"
        )
    print(f"interactive p99 beside / alone: {mixed.p99 / alone.p99:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
