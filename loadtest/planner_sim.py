"""The planner under closed-loop clients, on a simulated clock: what its choices give, for a cost model.

    python -m loadtest.planner_sim [--costs 8.1,0,1.33,0] [--clients 8] [--budget-ms 196]

Each client sends one text (a numbered corpus sentence's token count), waits for its answer, and sends
the next ``--rtt-ms`` later. Whenever the engine is free the real :class:`app.engine.planner.Planner`
picks the next batch from what is pending, with the queue's anchor rule (an item past ``--budget-ms``
must be in it), and the batch takes what the cost model (``a,b,c,d`` in ms, ``a + B·(b + c·S + d·S²)``)
says. Prints sentences/s, p50, p99 and p99 / p50 of the planner and of two other policies for a short
queue: everything pending in one batch, and the split that costs least in all, the rest right after it.
"""

from __future__ import annotations

import sys

import numpy as np

from app.engine import planner as planning
from app.engine.costs import CostModel
from loadtest.corpus import encode, load_corpus, tokenizer_of, unique_texts
from loadtest.harness import TWIN, parser


def least_in_all(plan: planning.Planner, lengths: np.ndarray, counts: np.ndarray) -> planning.Window:
    """The split of a short queue that costs least in all, the rest run as one batch right after it."""
    ordered = [int(n) for n, c in zip(lengths, counts, strict=True) for _ in range(int(c))]
    ends = np.cumsum(counts)
    best: tuple[float, int, int] | None = None
    for top in range(len(lengths)):
        for size in range(1, min(plan.limits.size, int(ends[top])) + 1):
            start, end = int(ends[top]) - size, int(ends[top])
            rest = ordered[:start] + ordered[end:]
            total = plan.model.cost(size, int(lengths[top])) + (
                plan.model.cost(len(rest), max(rest)) if rest else 0
            )
            if best is None or total < best[0] - 1e-12:
                best = (total, top, size)
    assert best is not None
    return planning.Window(best[1], best[2], plan.model.cost(best[2], int(lengths[best[1]])))


POLICIES = ("planner", "everything at once", "least in all")


def simulate(
    model: CostModel,
    lengths: np.ndarray,
    clients: int,
    budget_s: float,
    rtt_s: float,
    answers: int,
    policy: str = "planner",
) -> tuple[float, float, float]:
    """(sentences/s, p50 s, p99 s) of ``clients`` closed-loop clients of one text each under ``policy``
    (one of :data:`POLICIES`; the other two differ from the planner only where the queue is short)."""
    rng = np.random.default_rng(0)
    plan = planning.Planner(model, max_batch_size=8, max_batch_tokens=4096)
    now = 0.0
    pending: list[tuple[float, int]] = []  # (arrival, length)
    coming = sorted((rtt_s * rng.random(), int(rng.choice(lengths))) for _ in range(clients))
    latencies: list[float] = []
    while len(latencies) < answers:
        while coming and coming[0][0] <= now:
            pending.append(coming.pop(0))
        if not pending:
            now = coming[0][0]
            continue
        distinct = sorted({n for _, n in pending})
        counts = np.array([sum(1 for _, n in pending if n == d) for d in distinct], dtype=np.int64)
        oldest = min(pending)
        anchor = distinct.index(oldest[1]) if now - oldest[0] > budget_s else None
        sorted_lengths = np.array(distinct, dtype=np.int64)
        short = len(pending) <= plan.limits.size and len(pending) * distinct[-1] <= plan.limits.tokens
        if policy == "everything at once" and short:
            window = planning.Window(len(distinct) - 1, len(pending), 0.0)
        elif policy == "least in all" and short and anchor is None:
            window = least_in_all(plan, sorted_lengths, counts)
        else:
            window = plan.choose(sorted_lengths, counts, anchor, None)
        batch = []
        for length, take in plan.take(sorted_lengths, counts, window):
            for item in sorted(p for p in pending if p[1] == length)[:take]:
                pending.remove(item)
                batch.append(item)
        now += model.cost(len(batch), max(n for _, n in batch))
        for arrived, _ in batch:
            latencies.append(now - arrived)
            coming.append((now + rtt_s, int(rng.choice(lengths))))
        coming.sort()
    kept = np.array(latencies[answers // 10 :])  # the first tenth: the clients falling into step
    return len(latencies) / now, float(np.percentile(kept, 50)), float(np.percentile(kept, 99))


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.planner_sim", __doc__, model=TWIN)  # whose tokenizer counts the tokens
    p.add_argument("--costs", default="8.1,0,1.33,0", help="a,b,c,d in ms (default: 2 AVX2 cores)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--budget-ms", type=float, default=196.0, help="the queue-delay budget")
    p.add_argument("--rtt-ms", type=float, default=3.0, help="from an answer to the next request")
    p.add_argument("--answers", type=int, default=3000)
    args = p.parse_args(argv)
    a, b, c, d = (float(x) / 1000 for x in args.costs.split(","))
    model = CostModel(a, b, c, d)
    texts = unique_texts(load_corpus(), 0, 2000)
    lengths = np.array([len(x) for x in encode(tokenizer_of(args.model), texts)])
    print(f"{args.clients} clients x 1 text, cost {args.costs} ms, mean length {lengths.mean():.1f}")
    print(f"{'policy':<20}  sentences/s  p50 ms  p99 ms  p99/p50")
    budget_s, rtt_s = args.budget_ms / 1000, args.rtt_ms / 1000
    for policy in POLICIES:
        rate, p50, p99 = simulate(model, lengths, args.clients, budget_s, rtt_s, args.answers, policy=policy)
        print(f"{policy:<20}  {rate:>11.1f}  {p50 * 1000:>6.0f}  {p99 * 1000:>6.0f}  {p99 / p50:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
