"""Stage 3: fp32 graph → the fp16 (CUDA) and int8 (CPU) variants.

fp16 uses onnxruntime.transformers' optimizer (BERT fusions) and its fp16 conversion with fp32 inputs and
outputs; onnxconverter-common 1.16 writes fp16 graphs that fail to load, so it is not used. int8 is
signed int8 weights (QInt8: uint8 weights run 3-4x slower on VNNI/AMX CPUs), activations quantised at run
time per token (export/quantize.py) or, with the ``dynamic`` recipe, per tensor by onnxruntime.

The encoder's pooled outputs stay float32 in every variant: fp16 blocks the pooling nodes from conversion
(``graphs.pooling_nodes``), and neither int8 pass quantises them (they hold no MatMul, and the dynamic
recipe excludes them by name as well).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.onnx_model import OnnxModel
from onnxruntime.transformers.optimizer import optimize_model

from export import graphs, quantize, smoothquant
from export.spec import INT8_RECIPE, Int8Recipe


def _fuse(src: Path, num_heads: int, hidden_size: int, use_gpu: bool) -> OnnxModel:
    # opt_level=0: only the Python fusions, so the result does not depend on this machine's hardware;
    # ONNX Runtime applies its own optimisations when it loads the graph.
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    model = optimize_model(
        str(src),
        model_type="bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=0,
        use_gpu=use_gpu,
    )
    return model


def fuse(src: Path, dst: Path, num_heads: int, hidden_size: int, use_gpu: bool = False) -> dict[str, int]:
    """Write the BERT-fused graph of ``src`` to ``dst``; returns the fused operator counts."""
    model = _fuse(src, num_heads, hidden_size, use_gpu)
    model.save_model_to_file(str(dst))
    return {k: v for k, v in model.get_fused_operator_statistics().items() if v}


def drop_repeated_nodes(graph: onnx.GraphProto) -> int:
    """Remove the nodes that repeat an earlier node (same operator, inputs, outputs and attributes); returns
    how many went.

    onnxruntime.transformers' fp16 conversion before 1.32 adds one Cast to float32 per fp32 reader of a
    float16 tensor, each named and writing alike, so a graph whose pooling reads the hidden states twice
    fails to load ("two nodes with same node name"). A repeated node computes what its first copy did.
    """
    seen: set[bytes] = set()
    keep = []
    for node in graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            keep.append(node)
    dropped = len(graph.node) - len(keep)
    if dropped:
        del graph.node[:]
        graph.node.extend(keep)
    return dropped


def to_fp16(
    src: Path, dst: Path, num_heads: int, hidden_size: int, fused: bool = True
) -> dict[str, str | bool]:
    """fp16 weights and compute, fp32 inputs and outputs; ``fused`` applies the BERT fusions first.

    The pooling stays float32: it reads the fp16 hidden states cast to float32 (the same values the
    per-token outputs return), so a pooled output equals numpy pooling of the per-token output.
    """
    model = _fuse(src, num_heads, hidden_size, use_gpu=True) if fused else OnnxModel(onnx.load(str(src)))
    blocked = graphs.pooling_nodes(model.model)
    model.convert_float_to_float16(keep_io_types=True, node_block_list=blocked)
    drop_repeated_nodes(model.model.graph)
    model.save_model_to_file(str(dst))
    return {
        "tool": "onnxruntime.transformers",
        "fused": fused,
        "keep_io_types": True,
        "fp32_pooling": bool(blocked),
    }


def to_int8(
    src: Path,
    dst: Path,
    num_heads: int,
    hidden_size: int,
    calibration: Iterable[dict[str, np.ndarray]],
    recipe: Int8Recipe = INT8_RECIPE,
) -> dict[str, str | bool | int]:
    """int8 weights; activations quantised at run time (per token, or per tensor for ``dynamic``).

    Args:
        calibration: feeds for ``src`` whose activation maxima set the smoothing (``per_token`` only).
    """
    if recipe.method == "per_token":
        absmax = smoothquant.calibrate(src, calibration)
        quantize.quantize_per_token(src, dst, absmax, recipe.alpha, recipe.act_levels())
        return {"tool": "export.quantize", "weight_type": "QInt8", **recipe.describe()}
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        model_input = src
        extra: dict[str, object] = {}
        if recipe.fused:
            model_input = Path(tmp) / "fused.onnx"
            fuse(src, model_input, num_heads, hidden_size)
            # The fused graph lacks shape information for some tensors; without this the quantiser fails.
            extra["DefaultTensorType"] = onnx.TensorProto.FLOAT
        quantize_dynamic(
            model_input,
            dst,
            weight_type=QuantType.QInt8,
            per_channel=recipe.per_channel,
            nodes_to_exclude=graphs.pooling_nodes(onnx.load(str(model_input), load_external_data=False)),
            extra_options=extra,
        )
    return {"tool": "onnxruntime.quantization.quantize_dynamic", "weight_type": "QInt8", **recipe.describe()}
