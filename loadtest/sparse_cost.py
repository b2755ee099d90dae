"""Where ``/embed_sparse``'s inference time goes: the encoder and the sparse graph (the masked-LM head on
every real token, a GEMM as wide as the vocabulary, then SPLADE's pooling) timed apart on the same batches.

    python -m loadtest.sparse_cost [--model build/sparse-twin/model] [--variant int8] [--batch-size 8] \
        [--seconds 5]

In-process, with the service's session options: the corpus sorted by length in batches of
``--batch-size``, whole passes for at least ``--seconds``; each batch runs the encoder, then the sparse
graph on its last hidden state, as the engine does. Prints the encoder's and the sparse graph's ms per
batch, the sparse graph's share of both, and the share their FLOPs predict (per token: the head's
2·H² + 2·H·V against the encoder's, loadtest/raw_onnx.py); ``python -m loadtest.bench --routes
/embed,/embed_sparse`` prints the same line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.manifest import SPARSE_INPUTS, SPARSE_OUTPUT
from app.model.runtime import CPU
from loadtest import raw_onnx
from loadtest.corpus import encode, load_corpus, tokenizer_of
from loadtest.harness import parser


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
    """The sparse graph's session of ``variant``, beside the encoder as the service runs it; None when the
    export has none."""
    spec = raw_onnx.manifest(model_dir)["graphs"].get("sparse", {}).get(variant)
    return None if spec is None else raw_onnx.open_graph(model_dir / spec["file"], 0, provider, sessions=2)


def measure(
    model_dir: Path, variant: str, ids: list[np.ndarray], batch_size: int, min_seconds: float
) -> SparseCost | None:
    """The encoder and the sparse graph timed apart on :func:`~loadtest.raw_onnx.whole_passes` over ``ids``
    in length-sorted batches of ``batch_size``; None without a sparse graph."""
    sparse = open_sparse(model_dir, variant)
    if sparse is None:
        return None
    encoder = raw_onnx.open_encoder(model_dir, variant, sessions=2)
    shape = raw_onnx.shape_of(model_dir)
    encoder_flops = sum(shape.flops(len(x)) for x in ids)
    sparse_flops = head_flops(shape.hidden, int(sparse.get_outputs()[0].shape[1]), sum(len(x) for x in ids))

    def one(batch: dict[str, np.ndarray]) -> tuple[float, float]:
        t0 = time.perf_counter()
        (hidden,) = encoder.run([raw_onnx.LAST_HIDDEN_STATE], batch)
        t1 = time.perf_counter()
        sparse.run([SPARSE_OUTPUT], dict(zip(SPARSE_INPUTS, (hidden, batch["attention_mask"]), strict=True)))
        return t1 - t0, time.perf_counter() - t1

    times, passes = raw_onnx.whole_passes(raw_onnx.sorted_batches(ids, batch_size), one, min_seconds)
    encoder_s, sparse_s = np.mean(times, axis=0)
    flop_share = sparse_flops / (encoder_flops + sparse_flops)
    return SparseCost(variant, batch_size, 1e3 * float(encoder_s), 1e3 * float(sparse_s), flop_share, passes)


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.sparse_cost", __doc__, model=Path("build/sparse-twin/model"), seconds=5.0)
    p.add_argument("--variant", default="int8")
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)
    ids = encode(tokenizer_of(args.model), load_corpus())
    cost = measure(args.model, args.variant, ids, args.batch_size, args.seconds)
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
