"""The raw ceiling fetches what the service fetches for a default /embed; ``--sparse`` times the encoder and
the sparse graph apart, on the tiny export."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
from onnx import TensorProto, helper, save

from loadtest.corpus import encode, load_corpus, tokenizer_of
from loadtest.raw_onnx import LAST_HIDDEN_STATE, head_flops, open_encoder, service_output, sparse_cost


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


def test_the_sparse_graph_is_timed_apart_from_the_encoder(tiny_sparse_dir: Path) -> None:
    ids = encode(tokenizer_of(tiny_sparse_dir, max_length=128), load_corpus()[:40])
    cost = sparse_cost(tiny_sparse_dir, "int8", ids, batch_size=8, min_seconds=0.0)
    assert cost is not None and cost.passes == 1 and cost.batch_size == 8
    assert cost.encoder_ms > 0 and cost.sparse_ms > 0 and 0 < cost.share < 1
    # The tiny BERT's hidden 64 against its 21,128-token vocabulary: the head is most of the FLOPs.
    assert 0.5 < cost.flop_share < 1
    assert "sparse graph" in cost.line() and f"{cost.share:.1%}" in cost.line()


def test_a_model_without_the_sparse_graph_has_no_cost(tiny_model_dir: Path) -> None:
    assert sparse_cost(tiny_model_dir, "fp32", encode(tokenizer_of(tiny_model_dir), ["你好"]), 8, 0.0) is None


def test_the_heads_flops_are_its_transform_and_its_decoder() -> None:
    # bert-base-chinese, per token: 2·768² + 2·768·21128, a fifth of its encoder's ~170 MFLOPs.
    assert head_flops(768, 21128, 1) == 2 * (768 * 768 + 768 * 21128) == 33_632_256
