"""The raw ONNX Runtime encoder, in-process, with ideal batches: the ceiling any HTTP service is measured
against.

    python -m loadtest.raw_onnx [--model DIR] [--variants fp32,int8] [--seconds 2]
    python -m loadtest.raw_onnx --variants int8 --batches 2,4,8 --lengths 256,384,512   # long inputs

The grid times the encoder at batch 1, 8, 32 × sequence 16, 32, 128 (``--batches``, ``--lengths``) and prints sentences/s per variant
and the int8/fp32 ratio. Variants are interleaved within each cell (short rounds, alternating) so that a
machine that slows down mid-run slows every variant alike. Sessions use the service's options
(``app.model.runtime.session_options``, through ``loadtest.flops.session_options``), and fetch what the
service fetches for a default /embed (``service_output``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.runtime import CPU
from loadtest.flops import BertShape, session_options, synthetic_feed

LAST_HIDDEN_STATE = "last_hidden_state"
MEAN_PREFIX = "mean_"  # the encoder's pooled means are mean_{layer} (app/model/manifest.py)
DEFAULT_MODEL = Path("models/bert-base-chinese-twin")


def service_output(session: ort.InferenceSession) -> str:
    """The output a default /embed (mean pooling, last layer) fetches: the graph's pooled mean of its last
    layer, or, for a graph without pooled outputs, the last hidden state (the service then pools in numpy)."""
    means = [
        int(o.name[len(MEAN_PREFIX) :])
        for o in session.get_outputs()
        if o.name.startswith(MEAN_PREFIX) and o.name[len(MEAN_PREFIX) :].isdigit()
    ]
    return f"{MEAN_PREFIX}{max(means)}" if means else LAST_HIDDEN_STATE


def open_encoder(
    model_dir: Path, variant: str, threads: int = 0, provider: str = CPU
) -> ort.InferenceSession:
    """The encoder session of ``variant`` as listed in ``model_dir``'s manifest, on ``provider``.

    Raises:
        SystemExit: ONNX Runtime fell back to another provider.
    """
    manifest = json.loads((model_dir / "manifest.json").read_text())
    file = model_dir / manifest["graphs"]["encoder"][variant]["file"]
    session = ort.InferenceSession(str(file), session_options(threads, provider), providers=[provider])
    if session.get_providers()[0] != provider:
        raise SystemExit(f"the session fell back to {session.get_providers()} instead of {provider}")
    return session


def shape_of(model_dir: Path) -> BertShape:
    config = json.loads((model_dir / "manifest.json").read_text())["config"]
    return BertShape(config["num_layers"], config["hidden_size"], config["intermediate_size"])


def variants_in(model_dir: Path) -> list[str]:
    return list(json.loads((model_dir / "manifest.json").read_text())["graphs"]["encoder"])


def feed(ids: list[np.ndarray]) -> dict[str, np.ndarray]:
    """One right-padded batch, as the service builds it."""
    longest = max(len(x) for x in ids)
    input_ids = np.zeros((len(ids), longest), dtype=np.int64)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = x
    mask = (input_ids != 0).astype(np.int64)
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}


@dataclass
class CeilingResult:
    """Rates over whole passes; with tokenising, ``tokenize_s`` is its time in one pass (included)."""

    variant: str
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
    session: ort.InferenceSession,
    variant: str,
    ids: list[np.ndarray],
    batch_size: int,
    shape: BertShape,
    min_seconds: float,
    tokenize: Callable[[], list[np.ndarray]] | None = None,
) -> CeilingResult:
    """Whole passes over ``ids`` sorted by length, in batches of ``batch_size``, for at least ``min_seconds``.
    With ``tokenize``, each pass first tokenises its texts (its result stands for ``ids``), timed with it.

    Whole passes only: a partial pass over a length-sorted corpus would favour the short end.
    """
    tokenizing: list[float] = []

    def tokenized() -> list[np.ndarray]:
        assert tokenize is not None
        t0 = time.perf_counter()
        got = tokenize()
        tokenizing.append(time.perf_counter() - t0)
        return got

    ids = ids if tokenize is None else tokenized()  # the first pass's
    ordered = sorted(ids, key=len)
    batches = [feed(ordered[i : i + batch_size]) for i in range(0, len(ordered), batch_size)]
    useful = sum(shape.flops(len(x)) for x in ordered)
    computed = sum(shape.batch_flops(*b["input_ids"].shape) for b in batches)
    real_tokens = sum(len(x) for x in ordered)
    padded_tokens = sum(b["input_ids"].size for b in batches)
    fetch = [service_output(session)]
    session.run(fetch, batches[len(batches) // 2])  # warm the arena for a typical shape
    times: list[float] = []
    passes = 0
    start = time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        if tokenize is not None and passes:
            tokenized()
        for b in batches:
            t0 = time.perf_counter()
            session.run(fetch, b)
            times.append(time.perf_counter() - t0)
        passes += 1
    elapsed = sum(times) + sum(tokenizing)
    return CeilingResult(
        variant=variant,
        batch_size=batch_size,
        sentences_per_s=passes * len(ordered) / elapsed,
        batches_per_s=len(times) / elapsed,
        batch_ms=[t * 1000 for t in times],
        useful_flops_per_s=passes * useful / elapsed,
        computed_flops_per_s=passes * computed / elapsed,
        padding_share=1 - real_tokens / padded_tokens,
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


def _runs(
    sessions: dict[str, ort.InferenceSession], feed: dict[str, np.ndarray]
) -> dict[str, Callable[[], object]]:
    """Each session's call on ``feed``, fetching what the service fetches."""
    return {name: partial(s.run, [service_output(s)], feed) for name, s in sessions.items()}


def grid(
    model_dir: Path,
    variants: list[str],
    seconds: float,
    batches: tuple[int, ...] = (1, 8, 32),
    lengths: tuple[int, ...] = (16, 32, 128),
) -> list[dict[str, float | int | str]]:
    """sentences/s per variant at batch × sequence, variants interleaved within each cell."""
    sessions = {v: open_encoder(model_dir, v) for v in variants}
    rows: list[dict[str, float | int | str]] = []
    for batch in batches:
        for seq in lengths:
            med = interleaved(_runs(sessions, synthetic_feed(batch, seq)), seconds)
            row: dict[str, float | int | str] = {"batch": batch, "seq": seq}
            for v in variants:
                row[v] = batch / med[v]
            if "int8" in med and "fp32" in med:
                row["int8/fp32"] = med["fp32"] / med["int8"]
            rows.append(row)
            print(_grid_line(row, variants), flush=True)
    return rows


def _grid_line(row: dict[str, float | int | str], variants: list[str]) -> str:
    cells = [f"{row['batch']:>5} {row['seq']:>5}"] + [f"{float(row[v]):>10.1f}" for v in variants]
    if "int8/fp32" in row:
        cells.append(f"{float(row['int8/fp32']):>9.2f}x")
    return " ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.raw_onnx", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--variants", default=None, help="comma-separated; default: fp32,int8 where present")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing budget per cell")
    parser.add_argument("--batches", default="1,8,32", help="batch sizes of the grid, comma-separated")
    parser.add_argument(
        "--lengths", default="16,32,128", help="sequence lengths of the grid, comma-separated"
    )
    args = parser.parse_args(argv)
    present = variants_in(args.model)
    wanted = args.variants.split(",") if args.variants else [v for v in ("fp32", "int8") if v in present]
    missing = [v for v in wanted if v not in present]
    if missing:
        print(f"raw_onnx: {args.model} has no {missing}; it has {present}", file=sys.stderr)
        return 2
    print("sentences/s of the raw encoder session (fetching what a default /embed fetches)")
    print(
        f"{'batch':>5} {'seq':>5} "
        + " ".join(f"{v:>10}" for v in wanted)
        + ("  int8/fp32" if {"int8", "fp32"} <= set(wanted) else "")
    )
    batches, lengths = (tuple(int(n) for n in text.split(",")) for text in (args.batches, args.lengths))
    grid(args.model, wanted, args.seconds, batches, lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
