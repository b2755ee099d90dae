"""SmoothQuant (export/smoothquant.py) on small graphs: what is calibrated, what is smoothed, and that
smoothing leaves the product as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

from export.smoothquant import calibrate, gelu_outputs, smooth

K, N = 48, 24


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], feed)[0])


def _one_matmul(weight: np.ndarray, with_mask: bool = False) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])]
    if with_mask:  # unused by the graph, as calibration feeds carry it
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_matmul",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", N])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_calibration_takes_each_channels_peak_over_real_tokens_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    save(
        _one_matmul(rng.standard_normal((K, N)).astype(np.float32), with_mask=True), str(tmp_path / "m.onnx")
    )
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.int64)
    x[0, 2] = 1000.0  # padding: must not set the peaks
    absmax = calibrate(tmp_path / "m.onnx", [{"x": x, "attention_mask": mask}])
    np.testing.assert_array_equal(absmax["x"], np.abs(x[mask.astype(bool)]).max(axis=0))


def test_smoothing_moves_scale_into_the_weights_and_keeps_the_product() -> None:
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((K, N)).astype(np.float32)
    model = _one_matmul(weight)
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    x[..., 7] *= 50  # an outlier channel
    before = _run(model, {"x": x})
    assert smooth(model, {"x": np.abs(x).max(axis=(0, 1))}, 0.5) == 1
    assert [n.op_type for n in model.graph.node] == ["Mul", "MatMul"]
    np.testing.assert_allclose(_run(model, {"x": x}), before, rtol=1e-4, atol=1e-3)
    smoothed = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    inverse = next(v for k, v in smoothed.items() if k.endswith(".inv"))
    assert inverse[7] == inverse.min()  # the loud channel is divided the most


def test_gelu_outputs_are_not_smoothed() -> None:
    """The exporter's GELU (x·0.5·(1 + erf(x/√2))) feeding a MatMul: its output gets no smoothing Mul."""
    inits = [
        numpy_helper.from_array(np.array(2**0.5, dtype=np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        numpy_helper.from_array(np.ones((K, N), dtype=np.float32), "w_in"),
        numpy_helper.from_array(np.ones((N, K), dtype=np.float32), "w_out"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["h", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w_out"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", K])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert gelu_outputs(model) == {"g"}
    absmax = {"x": np.full(K, 4.0, dtype=np.float32), "g": np.full(N, 4.0, dtype=np.float32)}
    assert smooth(model, absmax, 0.5) == 1
    matmul_inputs = [n.input[0] for n in model.graph.node if n.op_type == "MatMul"]
    assert matmul_inputs[1] == "g" and matmul_inputs[0] != "x"
