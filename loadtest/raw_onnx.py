"""The raw ONNX Runtime encoder, in-process, with ideal batches: the ceiling any service is measured against,
its FLOP count, and the GEMM peak of this machine.

    python -m loadtest.raw_onnx [--model DIR] [--variants fp32,int8] [--seconds 2]
    python -m loadtest.raw_onnx --variants int8 --batches 2,4,8 --lengths 256,384,512   # long inputs
    python -m loadtest.raw_onnx --model build/sparse-twin/model --variants int8 --sparse 8 --seconds 5

The grid times the encoder at batch 1, 8, 32 × sequence 16, 32, 128 (or ``--batches`` × ``--lengths``) and
prints sentences/s per variant and the int8/fp32 ratio, the variants interleaved within each cell (a
machine that slows down mid-run slows each alike). Sessions use the service's options and fetch what it
fetches for a default /embed (``service_output``).

``--sparse N`` times instead where ``/embed_sparse``'s inference goes (:func:`sparse_cost`): the corpus
sorted by length in batches of N, whole passes for at least ``--seconds``, the encoder and the sparse graph
apart; it prints each one's ms per batch, the sparse graph's share of both, and the share their FLOPs
predict (per token: the head's 2·H² + 2·H·V against the encoder's). ``python -m loadtest.bench --routes
/embed,/embed_sparse`` prints the same line.

The FLOP count (multiply-add = 2 FLOP) of one sequence of ``L`` tokens through ``N`` layers of hidden size
``H`` and feed-forward size ``I``:

    F(L) = 2·L·N·(4·H² + 2·H·I)      Q, K, V, output projections and the two feed-forward matmuls
         + 4·N·L²·H                  attention scores Q·Kᵀ and the weighted sum A·V
         + 2·H²                      pooler (one token)

Embeddings, LayerNorm, GELU and softmax are left out (well under 1% at these sizes). "Useful" FLOP/s
counts each sentence at its own length; "computed" counts the padded batch shape. The peak is one large
GEMM of the same precision with the service's session options: fp32 ``MatMul`` and int8 ``MatMulInteger``
(uint8 activations × int8 weights, as the int8 graph runs them), shaped like BERT's feed-forward.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from app.model.manifest import SPARSE_INPUTS, SPARSE_OUTPUT, Variant, load_manifest
from app.model.runtime import CPU
from app.model.runtime import session_options as service_session_options
from loadtest.corpus import encode, load_corpus, tokenizer_of
from loadtest.harness import TWIN, parser

LAST_HIDDEN_STATE = "last_hidden_state"
MEAN_PREFIX = "mean_"  # the encoder's pooled means are mean_{layer} (app/model/manifest.py)
T = TypeVar("T")


@dataclass(frozen=True)
class BertShape:
    layers: int
    hidden: int
    intermediate: int

    def flops(self, length: int) -> float:
        """FLOPs of one sequence of ``length`` tokens (formula in the module docstring)."""
        n, h, i, L = self.layers, self.hidden, self.intermediate, length
        return 2.0 * L * n * (4 * h * h + 2 * h * i) + 4.0 * n * L * L * h + 2.0 * h * h


def session_options(threads: int = 0, provider: str = CPU, sessions: int = 1) -> ort.SessionOptions:
    """The service's session options (for a model of ``sessions`` sessions), ONNX Runtime's warnings off."""
    options = service_session_options(provider, threads, sessions)
    options.log_severity_level = 3
    return options


def gemm_peak(precision: str, m: int = 512, k: int = 768, n: int = 3072, seconds: float = 1.5) -> float:
    """Best observed FLOP/s of one ``[m, k] × [k, n]`` GEMM (``precision``: fp32 or int8)."""
    rng = np.random.default_rng(0)
    x: np.ndarray
    if precision == "fp32":
        w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
        types, op = (TensorProto.FLOAT, TensorProto.FLOAT), "MatMul"
        x = rng.standard_normal((m, k)).astype(np.float32)
    else:
        w = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")
        types, op = (TensorProto.UINT8, TensorProto.INT32), "MatMulInteger"
        x = rng.integers(0, 256, (m, k), dtype=np.uint8)
    inputs = [helper.make_tensor_value_info("x", types[0], ["m", k])]
    outputs = [helper.make_tensor_value_info("y", types[1], ["m", n])]
    graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"])], "gemm", inputs, outputs, [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=[CPU])
    best = interleaved({"gemm": partial(session.run, None, {"x": x})}, seconds, rounds=1, stat=min)
    return 2.0 * m * k * n / best["gemm"]


def synthetic_feed(batch: int, seq: int) -> dict[str, np.ndarray]:
    """Encoder inputs of fixed shape: random in-vocabulary ids between [CLS] and [SEP], no padding."""
    ids = np.random.default_rng(0).integers(1000, 20000, (batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def service_output(session: ort.InferenceSession) -> str:
    """The output a default /embed (mean pooling, last layer) fetches: the graph's pooled mean of its last
    layer, or, for a graph without pooled outputs, the last hidden state (the service then pools in numpy)."""
    layers = [o.name[len(MEAN_PREFIX) :] for o in session.get_outputs() if o.name.startswith(MEAN_PREFIX)]
    means = [int(layer) for layer in layers if layer.isdigit()]
    return f"{MEAN_PREFIX}{max(means)}" if means else LAST_HIDDEN_STATE


def open_graph(file: Path, threads: int = 0, provider: str = CPU, sessions: int = 1) -> ort.InferenceSession:
    """A session of the graph in ``file`` with :func:`session_options`, on ``provider`` (SystemExit when ONNX
    Runtime falls back to another)."""
    options = session_options(threads, provider, sessions)
    session = ort.InferenceSession(str(file), options, providers=[provider])
    if session.get_providers()[0] != provider:
        raise SystemExit(f"the session fell back to {session.get_providers()} instead of {provider}")
    return session


def open_encoder(
    model: Path, variant: Variant, threads: int = 0, provider: str = CPU, sessions: int = 1
) -> ort.InferenceSession:
    """The encoder session of ``variant`` as listed in ``model``'s manifest (:func:`open_graph`)."""
    file = model / load_manifest(model).graphs["encoder"][variant].file
    return open_graph(file, threads, provider, sessions)


def shape_of(model_dir: Path) -> BertShape:
    config = load_manifest(model_dir).config
    return BertShape(config.num_layers, config.hidden_size, config.intermediate_size)


def feed(ids: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """One right-padded batch, as the service builds it."""
    input_ids = np.zeros((len(ids), max(len(x) for x in ids)), dtype=np.int64)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = x
    mask = (input_ids != 0).astype(np.int64)
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}


def sorted_batches(ids: Sequence[np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
    """``ids`` sorted by length, in right-padded batches of ``batch_size`` (:func:`feed`)."""
    ordered = sorted(ids, key=len)
    return [feed(ordered[i : i + batch_size]) for i in range(0, len(ordered), batch_size)]


def whole_passes(
    batches: list[dict[str, np.ndarray]],
    run: Callable[[dict[str, np.ndarray]], T],
    min_seconds: float,
    between: Callable[[], object] | None = None,
) -> tuple[list[T], int]:
    """``run`` of every batch, whole passes (a partial one would favour the short end) for ``min_seconds`` at
    least, ``between`` before each pass but the first, after a warm-up run of the middle batch (the arenas,
    for a typical shape); the runs' results and the number of passes."""
    run(batches[len(batches) // 2])
    got: list[T] = []
    passes = 0
    start = time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        if passes and between is not None:
            between()
        got.extend(run(b) for b in batches)
        passes += 1
    return got, passes


@dataclass
class CeilingResult:
    """Rates over whole passes; with tokenising, ``tokenize_s`` is its time in one pass (included)."""

    batch_size: int
    sentences_per_s: float
    batches_per_s: float
    batch_ms: list[float]
    useful_flops_per_s: float
    computed_flops_per_s: float
    padding_share: float
    passes: int
    tokenize_s: float = 0.0


def ceiling(
    model: Path,
    variant: Variant,
    texts: Sequence[Any],
    batch_size: int,
    min_seconds: float,
    tokenize: bool = False,
    threads: int = 0,
    provider: str = CPU,
) -> CeilingResult:
    """The ceiling: :func:`whole_passes` over ``texts`` (strings, tokenised as the engine does, or ids)
    in :func:`sorted_batches` of ``batch_size``, in a session of ``variant`` of ``model``. With
    ``tokenize``, each pass first tokenises its texts, timed with it."""
    session, shape = open_encoder(model, variant, threads, provider), shape_of(model)
    tokenizer = tokenizer_of(model) if isinstance(texts[0], str) else None
    tokenizing: list[float] = []

    def tokenized() -> list[np.ndarray]:
        t0 = time.perf_counter()
        got = encode(tokenizer, list(texts))
        tokenizing.append(time.perf_counter() - t0)
        return got

    ids = list(texts) if tokenizer is None else tokenized()
    if not tokenize:
        tokenizing.clear()
    batches = sorted_batches(ids, batch_size)
    useful = sum(shape.flops(len(x)) for x in ids)
    computed = sum(b["input_ids"].shape[0] * shape.flops(b["input_ids"].shape[1]) for b in batches)
    padding = 1 - sum(len(x) for x in ids) / sum(b["input_ids"].size for b in batches)
    fetch = [service_output(session)]

    def timed(batch: dict[str, np.ndarray]) -> float:
        t0 = time.perf_counter()
        session.run(fetch, batch)
        return time.perf_counter() - t0

    times, passes = whole_passes(batches, timed, min_seconds, tokenized if tokenize else None)
    elapsed = sum(times) + sum(tokenizing)
    return CeilingResult(
        batch_size=batch_size,
        sentences_per_s=passes * len(ids) / elapsed,
        batches_per_s=len(times) / elapsed,
        batch_ms=[t * 1000 for t in times],
        useful_flops_per_s=passes * useful / elapsed,
        computed_flops_per_s=passes * computed / elapsed,
        padding_share=padding,
        passes=passes,
        tokenize_s=sum(tokenizing) / passes,
    )


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    seconds: float,
    rounds: int = 6,
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """``stat`` of the seconds per call of each run (one warm-up call each first), alternating between
    them in ``rounds`` short rounds that share ``seconds``, at least one call each a round."""
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    per_round = seconds / rounds / max(1, len(runs))
    for _ in range(rounds):
        for name, run in runs.items():
            end = time.perf_counter() + per_round
            while True:
                t0 = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - t0)
                if time.perf_counter() > end:
                    break
    return {name: stat(s) for name, s in samples.items()}


def rates(
    sessions: Mapping[str, ort.InferenceSession],
    cells: list[tuple[int, int]],
    seconds: float,
    rounds: int = 6,
    stat: Callable[[list[float]], float] = statistics.median,
    fetch: str | None = None,
) -> dict[tuple[str, int, int], float]:
    """Sentences/s of each session at each (batch, sequence) cell of :func:`synthetic_feed`, sessions
    interleaved within a cell (:func:`interleaved`); each fetches ``fetch``, or what /embed fetches."""
    out: dict[tuple[str, int, int], float] = {}
    for batch, seq in cells:
        x = synthetic_feed(batch, seq)
        runs = {k: partial(s.run, [fetch or service_output(s)], x) for k, s in sessions.items()}
        out.update({(k, batch, seq): batch / t for k, t in interleaved(runs, seconds, rounds, stat).items()})
    return out


@dataclass(frozen=True)
class SparseCost:
    """Seconds per batch of the encoder and of the sparse graph, over the same batches."""

    variant: str
    batch_size: int
    encoder_ms: float
    sparse_ms: float
    flop_share: float  # the sparse graph's share of the FLOPs of both
    passes: int

    @property
    def share(self) -> float:
        """The sparse graph's share of the time of both."""
        return self.sparse_ms / (self.encoder_ms + self.sparse_ms)

    def line(self) -> str:
        return (
            f"sparse head ({self.variant}, batches of {self.batch_size}, {self.passes} passes): encoder "
            f"{self.encoder_ms:.1f} ms + sparse graph {self.sparse_ms:.1f} ms a batch: {self.share:.1%} of "
            f"the time (FLOPs predict {self.flop_share:.1%}); /embed_sparse's ceiling ≈ "
            f"{1 - self.share:.2f} × /embed's"
        )


def head_flops(hidden: int, vocab: int, tokens: int) -> float:
    """FLOPs of the masked-LM head on ``tokens`` tokens: its transform (H × H) and decoder (H × V)."""
    return 2.0 * tokens * (hidden * hidden + hidden * vocab)


def sparse_cost(
    model_dir: Path, variant: Variant, ids: list[np.ndarray], batch_size: int, min_seconds: float
) -> SparseCost | None:
    """Where ``/embed_sparse``'s inference time goes: the encoder and the sparse graph (the masked-LM head on
    every real token, a GEMM as wide as the vocabulary, then SPLADE's pooling) timed apart, each batch
    running the encoder, then the sparse graph on its last hidden state, as the engine does (two sessions),
    on :func:`whole_passes` over ``ids`` in length-sorted batches of ``batch_size``; None without a sparse
    graph."""
    spec = load_manifest(model_dir).graphs.get("sparse", {}).get(variant)
    if spec is None:
        return None
    sparse = open_graph(model_dir / spec.file, sessions=2)
    encoder = open_encoder(model_dir, variant, sessions=2)
    shape = shape_of(model_dir)
    encoder_flops = sum(shape.flops(len(x)) for x in ids)
    sparse_flops = head_flops(shape.hidden, int(sparse.get_outputs()[0].shape[1]), sum(len(x) for x in ids))

    def one(batch: dict[str, np.ndarray]) -> tuple[float, float]:
        t0 = time.perf_counter()
        (hidden,) = encoder.run([LAST_HIDDEN_STATE], batch)
        t1 = time.perf_counter()
        sparse.run([SPARSE_OUTPUT], dict(zip(SPARSE_INPUTS, (hidden, batch["attention_mask"]), strict=True)))
        return t1 - t0, time.perf_counter() - t1

    times, passes = whole_passes(sorted_batches(ids, batch_size), one, min_seconds)
    encoder_s, sparse_s = np.mean(times, axis=0)
    flop_share = sparse_flops / (encoder_flops + sparse_flops)
    return SparseCost(variant, batch_size, 1e3 * float(encoder_s), 1e3 * float(sparse_s), flop_share, passes)


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.raw_onnx", __doc__, model=TWIN, seconds=2.0)
    p.add_argument(
        "--variants", type=lambda t: t.split(","), help="comma-separated; default: fp32,int8 where present"
    )
    p.add_argument("--batches", default="1,8,32", help="batch sizes of the grid, comma-separated")
    p.add_argument("--lengths", default="16,32,128", help="sequence lengths of the grid, comma-separated")
    p.add_argument("--sparse", type=int, metavar="N", help="the sparse graph's cost in batches of N instead")
    args = p.parse_args(argv)
    if args.sparse:
        variant: Variant = args.variants[0] if args.variants else "int8"
        ids = encode(tokenizer_of(args.model), load_corpus())
        cost = sparse_cost(args.model, variant, ids, args.sparse, args.seconds)
        if cost is None:
            raise SystemExit(f"{args.model} has no {variant} sparse graph (python -m export --sparse max)")
        print(cost.line())
        return 0
    present = load_manifest(args.model).variants
    wanted = args.variants or [v for v in ("fp32", "int8") if v in present]
    missing = [v for v in wanted if v not in present]
    if missing:
        print(f"raw_onnx: {args.model} has no {missing}; it has {present}", file=sys.stderr)
        return 2
    both = {"int8", "fp32"} <= set(wanted)
    print("sentences/s of the raw encoder session (fetching what a default /embed fetches)")
    header = " ".join(f"{v:>10}" for v in wanted) + ("  int8/fp32" if both else "")
    print(f"{'batch':>5} {'seq':>5} {header}")
    sessions = {v: open_encoder(args.model, v) for v in wanted}
    batches, lengths = (tuple(int(n) for n in text.split(",")) for text in (args.batches, args.lengths))
    for cell in [(b, s) for b in batches for s in lengths]:
        got = rates(sessions, [cell], args.seconds)
        line = [f"{cell[0]:>5} {cell[1]:>5}"] + [f"{got[(v, *cell)]:>10.1f}" for v in wanted]
        ratio = [f"{got[('int8', *cell)] / got[('fp32', *cell)]:>9.2f}x"] if both else []
        print(" ".join(line + ratio), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
