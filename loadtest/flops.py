"""FLOP counts for a BERT encoder and a measured GEMM peak on this machine.

The count (multiply-add = 2 FLOP) of one sequence of ``L`` tokens through ``N`` layers of hidden size
``H`` and feed-forward size ``I``:

    F(L) = 2·L·N·(4·H² + 2·H·I)      Q, K, V, output projections and the two feed-forward matmuls
         + 4·N·L²·H                  attention scores Q·Kᵀ and the weighted sum A·V
         + 2·H²                      pooler (one token)

Embeddings, LayerNorm, GELU and softmax are left out (well under 1% at these sizes). "Useful" FLOP/s
counts each sentence at its own length; "computed" counts the padded batch shape.

The peak is one large GEMM of the same precision run by ONNX Runtime with the service's own session options
(``app.model.runtime.session_options``): fp32 ``MatMul`` and int8 ``MatMulInteger`` (uint8 activations × int8 weights, as the int8
graph runs them), shaped like BERT's feed-forward on a batch of tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from app.model.runtime import CPU
from app.model.runtime import session_options as service_session_options


@dataclass(frozen=True)
class BertShape:
    layers: int
    hidden: int
    intermediate: int

    def flops(self, length: int) -> float:
        """FLOPs of one sequence of ``length`` tokens (formula in the module docstring)."""
        n, h, i, L = self.layers, self.hidden, self.intermediate, length
        return 2.0 * L * n * (4 * h * h + 2 * h * i) + 4.0 * n * L * L * h + 2.0 * h * h

    def batch_flops(self, batch: int, length: int) -> float:
        return batch * self.flops(length)


def session_options(threads: int = 0, provider: str = CPU) -> ort.SessionOptions:
    """The service's session options (``app.model.runtime.session_options``, not a copy, so ceilings
    measure the service's set-up), with ONNX Runtime's warnings off."""
    options = service_session_options(provider, threads)
    options.log_severity_level = 3
    return options


def _gemm_model(precision: str, k: int, n: int) -> bytes:
    rng = np.random.default_rng(0)
    if precision == "fp32":
        w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        w = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, ["m", k])
        y = helper.make_tensor_value_info("y", TensorProto.INT32, ["m", n])
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "gemm", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def gemm_peak(precision: str, m: int = 512, k: int = 768, n: int = 3072, seconds: float = 1.5) -> float:
    """Best observed FLOP/s of one ``[m, k] × [k, n]`` GEMM (``precision``: fp32 or int8)."""
    session = ort.InferenceSession(_gemm_model(precision, k, n), session_options(), providers=[CPU])
    rng = np.random.default_rng(1)
    x: np.ndarray
    if precision == "fp32":
        x = rng.standard_normal((m, k)).astype(np.float32)
    else:
        x = rng.integers(0, 256, (m, k), dtype=np.uint8)
    for _ in range(3):
        session.run(None, {"x": x})
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * k * n / best


def synthetic_feed(batch: int, seq: int) -> dict[str, np.ndarray]:
    """Encoder inputs of fixed shape: random in-vocabulary ids between [CLS] and [SEP], no padding."""
    ids = np.random.default_rng(0).integers(1000, 20000, (batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
