"""The raw ceiling fetches what the service fetches for a default /embed."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
from onnx import TensorProto, helper, save

from loadtest.raw_onnx import LAST_HIDDEN_STATE, open_encoder, service_output


def test_a_graph_with_pooled_outputs_is_asked_for_the_last_layers_mean(tiny_model_dir: Path) -> None:
    for variant in ("fp32", "int8"):
        assert service_output(open_encoder(tiny_model_dir, variant, threads=1)) == "mean_3"


def test_a_graph_without_them_is_asked_for_the_last_hidden_state(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [LAST_HIDDEN_STATE])],
        "older",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
        [helper.make_tensor_value_info(LAST_HIDDEN_STATE, TensorProto.FLOAT, [1, 2, 4])],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "g.onnx"))
    session = ort.InferenceSession(str(tmp_path / "g.onnx"), providers=["CPUExecutionProvider"])
    assert service_output(session) == LAST_HIDDEN_STATE
