"""Where ``/embed_sparse``'s inference time goes: the encoder and the sparse graph (the masked-LM head on
every real token, a GEMM as wide as the vocabulary, then SPLADE's pooling) timed apart on the same batches.

    python -m loadtest.sparse_cost [--model build/sparse-twin/model] [--variant int8] [--batch-size 8] \
        [--seconds 5]

In-process, with the service's session options: the corpus sorted by length in batches of
``--batch-size`` (the service's max_batch_size), whole passes for at least ``--seconds``; each batch runs
the encoder to its last hidden state, then the sparse graph on it cut to the batch's longest, as the
engine does (app/engine/inference.py). Prints the encoder's and the sparse graph's ms per batch, the
sparse graph's share of both, and the share their FLOPs predict (per token: the head's 2·H² + 2·H·V
against the encoder's, loadtest/raw_onnx.py). ``python -m loadtest.bench --routes /embed,/embed_sparse``
prints the same line beside its service rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.manifest import SPARSE_INPUTS, SPARSE_OUTPUT
from app.model.runtime import CPU
from loadtest.corpus import encode, load_corpus, tokenizer_of
from loadtest.raw_onnx import LAST_HIDDEN_STATE, BertShape, feed, open_encoder, session_options, shape_of


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


def open_sparse(model_dir: Path, variant: str, provider: str = CPU) -> ort.InferenceSession | None:
    """The sparse graph's session of ``variant``; None when the export has none."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    spec = manifest["graphs"].get("sparse", {}).get(variant)
    if spec is None:
        return None
    options = session_options(0, provider, sessions=2)  # beside the encoder, as the service runs it
    return ort.InferenceSession(str(model_dir / spec["file"]), options, providers=[provider])


def measure(
    model_dir: Path, variant: str, ids: list[np.ndarray], batch_size: int, min_seconds: float
) -> SparseCost | None:
    """The encoder and the sparse graph timed apart on ``ids`` sorted by length, in batches of
    ``batch_size``, whole passes for at least ``min_seconds``; None without a sparse graph."""
    sparse = open_sparse(model_dir, variant)
    if sparse is None:
        return None
    encoder = open_encoder(model_dir, variant, sessions=2)
    shape: BertShape = shape_of(model_dir)
    vocab = int(sparse.get_outputs()[0].shape[1])
    ordered = sorted(ids, key=len)
    batches = [feed(ordered[i : i + batch_size]) for i in range(0, len(ordered), batch_size)]
    lengths = [len(x) for x in ordered]
    encoder_flops = sum(shape.flops(n) for n in lengths)
    sparse_flops = head_flops(shape.hidden, vocab, sum(lengths))

    def one(batch: dict[str, np.ndarray]) -> tuple[float, float]:
        t0 = time.perf_counter()
        (hidden,) = encoder.run([LAST_HIDDEN_STATE], batch)
        t1 = time.perf_counter()
        sparse.run([SPARSE_OUTPUT], dict(zip(SPARSE_INPUTS, (hidden, batch["attention_mask"]), strict=True)))
        return t1 - t0, time.perf_counter() - t1

    one(batches[len(batches) // 2])  # warm the arenas for a typical shape
    enc: list[float] = []
    head: list[float] = []
    passes = 0
    start = time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        for b in batches:
            e, s = one(b)
            enc.append(e)
            head.append(s)
        passes += 1
    return SparseCost(
        variant=variant,
        batch_size=batch_size,
        encoder_ms=1e3 * float(np.mean(enc)),
        sparse_ms=1e3 * float(np.mean(head)),
        flop_share=sparse_flops / (encoder_flops + sparse_flops),
        passes=passes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.sparse_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, default=Path("build/sparse-twin/model"))
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    cost = measure(
        args.model,
        args.variant,
        encode(tokenizer_of(args.model), load_corpus()),
        args.batch_size,
        args.seconds,
    )
    if cost is None:
        print(
            f"{args.model} has no {args.variant} sparse graph (python -m export --sparse max)",
            file=sys.stderr,
        )
        return 1
    print(cost.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
