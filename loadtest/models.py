"""Several models in one process against one process per model, on the same cores.

    python -m loadtest.models [--embedder DIR] [--variant int8] [--duration 60] [--rounds 2] [--warmup 5] \
        [--background 64x32] [--quick]

The embedder (default the bert-base-chinese twin, ``models/bert-base-chinese-twin``) and the tests' tiny
cross-encoder and token classifier (exported here; ``--heads DIR`` keeps them), served by one process
(``ZHEMBED_MODELS``) and by three side by side, each under the same mixed load of closed-loop clients
(``/embed`` 8 × 1 text, ``/rerank`` 4 × (1 query, 8 documents), ``/token-classification`` 2 × 1 text);
and the one process under it beside a u=7 ``--background`` client on the embedder. ``--duration`` is
each arrangement's, in ``--rounds`` cells taken in turns (one, three; three, one; ...), each on servers
started for it alone, so that a machine whose speed drifts favours neither; a row pools its rounds (the
requests over the summed windows, p99 over every latency). A few probes (each route of each model) are
asked of both first. Prints a row per arrangement and route (requests/s, p50 / p99 ms, errors), the PSS
of each arrangement's process tree after its load (the largest of its rounds), and issue 33's targets as
PASS / MISS lines; JSON in loadtest/results/. ``--quick``: tiny models, one 2 s round (CI).
docs/performance.md says what each arrangement and target is.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
import uvloop

from loadtest import procs
from loadtest.corpus import load_corpus
from loadtest.harness import TWIN, parser
from loadtest.harness.cell import STRIDE, Cell, closed_loops, distinct_bodies, parse_cells
from loadtest.harness.measure import Measured
from loadtest.harness.report import NAN, Column, Goal, Row, Table, cpu_model, target, write_json
from loadtest.harness.service import service_env
from loadtest.loadgen import CellResult
from loadtest.quick_model import exported, tiny_model
from loadtest.server import ServiceProcess, post

NAMES = ("embed", "rerank", "ner")
ENTITY_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
# Closed-loop clients of each model's route; on /rerank, texts are the documents beside the query.
MIXED = [
    Cell(8, 1, route="/embed", model="embed"),
    Cell(4, 8, route="/rerank", model="rerank"),
    Cell(2, 1, route="/token-classification", model="ner"),
]
CLIENTS, RATE = Column("clients", 7, "d", "clients"), Column("req/s", 8, ".1f", "requests_per_s")
ERRORS = Column("errors", 7, "d", "errors")
# The label is the arrangement, then the route.
TABLE = Table(f"{'arrangement':<32} route", 61, CLIENTS, RATE, "p50 ms", "p99 ms", ERRORS, tail="")
Rows = dict[str, Row]  # an arrangement's rows, by route (and urgency)
Ports = dict[str | None, int]  # the port of each model's server
# Strides of texts one load's cells may take (one each: at most 4).
LOAD_STRIDES = 8
# Issue 33's targets.
PSS_RATIO = 0.8
BACKGROUND_P99_RATIO = 1.5


def load(
    ports: Ports, cells: list[Cell], texts: tuple[list[str], int], seconds: float, warmup: float
) -> list[CellResult]:
    """Every cell's clients at once, each against the port of its model; ``texts``: the corpus and where
    this load's texts start in it (each cell a ``STRIDE`` further)."""
    corpus, start = texts
    loads = [
        (
            ports[c.model],
            c,
            distinct_bodies(corpus, c.texts, start + k * STRIDE, route=c.route, model=c.model),
        )
        for k, c in enumerate(cells)
    ]
    return uvloop.run(closed_loops(loads, seconds, warmup))


def rows(label: str, cells: list[Cell], rounds: list[list[CellResult]]) -> Rows:
    """Each cell's row of the arrangement ``label``, its ``rounds`` pooled, printed, by route (and urgency,
    where it has one)."""
    out: Rows = {}
    for k, c in enumerate(cells):
        route = c.route + ("" if c.urgency is None else f" (u={c.urgency})")
        pooled = CellResult.pooled([results[k] for results in rounds])
        row = out[route] = Row.of(Measured(c, pooled, NAN, NAN, {}, {}), label=f"{label:<32} {route}")
        row.extra.update(arrangement=label, route=route, rounds=len(rounds))
        print(TABLE.row(row, ""), flush=True)
    return out


def _export_heads(folder: Path, variant: str) -> None:
    from export.pipeline import ExportOptions, run_export
    from tests.checkpoints import save_head
    from tests.conftest import make_tiny_source

    for head, architecture, labels, seed in (
        ("reranker", "BertForSequenceClassification", ["LABEL_0"], 21),
        ("tagger", "BertForTokenClassification", ENTITY_LABELS, 22),
    ):
        base = make_tiny_source(folder / f"{head}-base", seed=seed)
        source = save_head(folder / f"{head}-source", base, architecture, labels, std=0.5)
        options = ExportOptions(out=folder / head, model=str(source), variants=(variant,))  # type: ignore[arg-type]
        run_export(options, log=lambda _line: None)


# Requests whose answers must be the same from either arrangement: (model, route, body).
PROBES: list[tuple[str, str, dict[str, Any]]] = [
    ("embed", "/embed", {"inputs": ["今天天气很好", "北京是中国的首都。"]}),
    ("embed", "/similarity", {"inputs": {"source_sentence": "你好", "sentences": ["您好", "再见"]}}),
    (
        "rerank",
        "/rerank",
        {"query": "北京的天气", "texts": ["北京今天晴", "上海下雨了"], "return_text": True},
    ),
    ("rerank", "/embed", {"inputs": "北京今天晴"}),
    ("ner", "/token-classification", {"inputs": ["我叫王小明，住在北京市海淀区。"]}),
]


def probe(ports: Ports) -> list[tuple[int, Any]]:
    """Each probe's status and answer, from the server of its model."""
    answers = [post(ports[m], path, orjson.dumps({**body, "model": m})) for m, path, body in PROBES]
    return [(a.status_code, orjson.loads(a.content)) for a in answers]


def same_answers(got: list[tuple[int, Any]], want: list[tuple[int, Any]]) -> list[str]:
    """The probes whose answers differ (statuses, or beyond tests/app/vectors.py's tolerances)."""
    from tests.app.vectors import assert_same_answer

    differ = []
    for (model, path, _), (status, answer), (status_want, answer_want) in zip(PROBES, got, want, strict=True):
        try:
            assert status == status_want == 200, (status, status_want)
            assert_same_answer(answer, answer_want, path)
        except AssertionError:
            differ.append(f"{model} {path}")
    return differ


def targets(differ: list[str], alone: Rows, beside: Rows, apart: Rows, pss: dict[str, float]) -> list[str]:
    """Issue 33's targets, from each arrangement's rows by route and its PSS."""
    total_one, total_three = (sum(r.requests_per_s or 0.0 for r in rows.values()) for rows in (alone, apart))
    same = f"{len(PROBES) - len(differ)} of {len(PROBES)} the same"
    differing = f" (differ: {', '.join(differ)})" if differ else ""
    p99, pss_ratio = "{raw:.1f} vs {per:.1f} ms (<= 1.0x)", pss["one"] / pss["three"]
    each = [
        Goal(f"{r} p99, one process vs three", r, "p99_ms", "<=", 1.0, p99, apart[r].p99_ms) for r in alone
    ]
    name = "/rerank p99 beside the u=7 background vs without"
    bound = "{:.2f}x (<= {bound})"
    rerank = Goal(name, "/rerank", "p99_ms", "<=", BACKGROUND_P99_RATIO, bound, alone["/rerank"].p99_ms)
    total = f"{total_one:.1f} vs {total_three:.1f} (>= 1.0x)"
    return [
        target("every probe's answer, one process vs three", not differ, f"{same}{differing}"),
        target("total requests/s, one process vs three", total_one >= total_three, total),
        *(goal.line(alone) for goal in each),
        target("PSS, one process vs three", pss_ratio <= PSS_RATIO, f"{pss_ratio:.2f}x (<= {PSS_RATIO})"),
        rerank.line(beside),
    ]


def main(argv: list[str] | None = None) -> int:
    quick_help = "tiny models (fp32), one 2 s round, 8x4 background (CI)"
    p = parser("loadtest.models", __doc__, quick_help, duration=60.0, warmup=5.0, out=None)
    p.add_argument("--embedder", type=Path, default=TWIN, help="the embedder's exported folder")
    p.add_argument("--heads", type=Path, default=None, help="where the tiny heads are (exported once)")
    p.add_argument("--variant", default="int8", help="every model's graph variant")
    p.add_argument("--background", default="64x32", help="clients x texts of the u=7 embedder client")
    p.add_argument("--rounds", type=int, default=2, help="cells per arrangement, taken in turns")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup, args.background, args.variant = 2.0, 1, 0.5, "8x4", "fp32"
    elif not (args.embedder / "manifest.json").is_file():
        p.error(f"{args.embedder} holds no exported model: `make twin` exports the bert-base-chinese twin")
    (bg,) = parse_cells(args.background)
    background = Cell(bg.clients, bg.texts, route="/embed", urgency=7, model="embed")
    seconds = args.duration / args.rounds

    def serve(name: str, env: dict[str, str]) -> ServiceProcess:
        return ServiceProcess("app", env, Path(tempfile.gettempdir()) / f"zhembed-models-{name}.log")

    heads = ["reranker/manifest.json", "tagger/manifest.json"]
    with (
        tiny_model(None if args.quick else args.embedder, (args.variant,)) as embedder,
        exported(
            f"heads-{args.variant}", heads, lambda f: _export_heads(f, args.variant), args.heads
        ) as tiny,
    ):
        folders = {"embed": embedder, "rerank": tiny / "reranker", "ner": tiny / "tagger"}
        # Room for every client at once: the background's u=7 requests may fill half the embedder's budget.
        room = 2 * (background.inputs + 64)
        entries = ",".join(
            f"{n}={folders[n]}" + (f";max_concurrent_inputs={room}" if n == "embed" else "") for n in NAMES
        )
        quick = {"measure_batch_cost": False} if args.quick else {}
        envs = {
            "one": {"one": service_env(embedder, args.variant, room + 1024, models=entries, **quick)},
            "three": {n: service_env(folders[n], args.variant, 1024, **quick) for n in NAMES},
        }
        print(
            f"zhembed several models: {args.variant}; embedder {embedder}, reranker {folders['rerank']}, "
            f"tagger {folders['ner']}; {args.rounds} round(s) of {seconds:g} s cells (+{args.warmup:g} s "
            f"warm-up) per arrangement; {len(os.sched_getaffinity(0))} cores ({cpu_model()}) shared by "
            "clients and servers",
            flush=True,
        )
        answers: dict[str, list[tuple[int, Any]]] = {}
        got: dict[str, list[list[CellResult]]] = {"one": [], "three": [], "beside": []}
        corpus = load_corpus()
        pss: dict[str, float] = {"one": 0.0, "three": 0.0}
        for k in range(args.rounds):
            for name in ("one", "three") if k % 2 == 0 else ("three", "one"):
                with contextlib.ExitStack() as stack:
                    services = [stack.enter_context(serve(n, env)) for n, env in envs[name].items()]
                    ports: Ports = {n: services[0 if name == "one" else i].port for i, n in enumerate(NAMES)}
                    if name not in answers:
                        answers[name] = probe(ports)
                    # Both arrangements of a round get the same texts, new to each server.
                    texts = (corpus, (2 * k + 1) * LOAD_STRIDES * STRIDE)
                    got[name].append(load(ports, MIXED, texts, seconds, args.warmup))
                    pss[name] = max(pss[name], sum(procs.tree(s.pid).memory.pss for s in services) / 2**20)
                    if name == "one":
                        texts = (corpus, (2 * k + 2) * LOAD_STRIDES * STRIDE)
                        got["beside"].append(load(ports, [*MIXED, background], texts, seconds, args.warmup))
        print(TABLE.header)
        alone = rows("one process, three models", MIXED, got["one"])
        beside = rows("one process, with background", [*MIXED, background], got["beside"])
        apart = rows("three processes", MIXED, got["three"])
        print(
            f"memory (PSS of the process trees, after their load): one process {pss['one']:.0f} MB, "
            f"three {pss['three']:.0f} MB"
        )
        lines = targets(same_answers(answers["one"], answers["three"]), alone, beside, apart, pss)
        print("targets (issue 33):", *lines, sep="\n")
        everything = [*alone.values(), *beside.values(), *apart.values()]
        report = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": [r.as_json() for r in everything],
            "pss_mb": pss,
            "targets": lines,
        }
        write_json(report, args.out, "models")
    # Every interactive cell must be answered; a background (u=7) one may get nothing in a short cell:
    # interactive work comes first, and it is served only as it ages.
    interactive = [r for r in everything if "(u=" not in r.extra["route"]]
    return 1 if any(r.errors for r in everything) or not all(r.requests_per_s for r in interactive) else 0


if __name__ == "__main__":
    raise SystemExit(main())
