"""The encoder graph's pooled outputs (export/graphs.py): computed in the graph, float in every variant.

Each variant's ``cls_{i}``/``mean_{i}`` must equal numpy pooling (app/engine/pooling.py) of that same graph's
own per-token outputs: the service may take either, and a client must not be able to tell which it got.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.engine import pooling
from app.model.manifest import (
    ALWAYS_POOLED,
    LAST_HIDDEN_STATE,
    POOLER_OUTPUT,
    VARIANTS,
    layer_output_name,
    load_manifest,
)
from export import graphs, source, variants
from export.spec import Int8Recipe
from tests.conftest import TINY_CONFIG

LAYERS = cast(int, TINY_CONFIG["num_hidden_layers"])
HEADS = cast(int, TINY_CONFIG["num_attention_heads"])
HIDDEN = cast(int, TINY_CONFIG["hidden_size"])
# What numpy and ONNX Runtime may differ by when both pool the same float32 token states (the order of
# a float32 sum): measured 1.2e-7 (fp32), 1.8e-7 (int8), 0 (fp16: sums of few fp16 values are exact).
TOLERANCE = 1e-6


def _feed() -> dict[str, np.ndarray]:
    """A padded batch: full, half-padded, one real token, and no real token (the count's clamp)."""
    ids = np.random.default_rng(5).integers(672, 8000, (4, 11)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 1:] = 0
    mask[3, :] = 0
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _run_all(path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feed = _feed()
    return dict(zip(names, session.run(names, feed), strict=True)), feed["attention_mask"]


def _assert_pooled_equal_numpy_pooling(path: Path, layers: range) -> None:
    got, mask = _run_all(path)
    for layer in layers:
        hidden = got[layer_output_name(layer, LAYERS)]
        for mode in ALWAYS_POOLED:
            expected = pooling.POOLERS[mode](hidden, mask)
            np.testing.assert_allclose(
                got[f"{mode}_{layer}"], expected, rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{mode}_{layer}"
            )
    np.testing.assert_array_equal(got[f"mean_{LAYERS}"][3], 0)  # no real token: 0, not NaN


@pytest.fixture(scope="module")
def last_only(tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    loaded = source.load(source.resolve(str(tiny_source_dir), None), twin=False)
    path = tmp_path_factory.mktemp("last-only") / "encoder.onnx"
    graphs.export_encoder(loaded, path, 17, all_layers=False)
    assert [s.name for s in graphs.encoder_outputs(loaded, all_layers=False)] == [
        LAST_HIDDEN_STATE,
        POOLER_OUTPUT,
        f"cls_{LAYERS}",
        f"mean_{LAYERS}",
    ]
    return path


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variants_pooled_outputs_equal_numpy_pooling_of_its_own_token_outputs(
    tiny_model_dir: Path, variant: str
) -> None:
    """For int8 this also shows the pooling is not quantised; for fp16, that it runs in float32 (fp16
    rounding would differ by ~1e-3)."""
    graph = load_manifest(tiny_model_dir).graphs["encoder"][variant]  # type: ignore[index]
    _assert_pooled_equal_numpy_pooling(tiny_model_dir / graph.file, range(1, LAYERS + 1))


@pytest.mark.parametrize("fused", [False, True])
def test_the_dynamic_int8_recipe_leaves_the_pooling_float(
    tiny_model_dir: Path, tmp_path: Path, fused: bool
) -> None:
    dst = tmp_path / "encoder.dynamic.onnx"
    fp32 = tiny_model_dir / "encoder.fp32.onnx"
    variants.to_int8(fp32, dst, HEADS, HIDDEN, [], Int8Recipe(method="dynamic", fused=fused))
    _assert_pooled_equal_numpy_pooling(dst, range(1, LAYERS + 1))


def test_a_last_layer_only_graph_pools_the_last_layer(last_only: Path) -> None:
    outputs = [o.name for o in onnx.load(str(last_only)).graph.output]
    assert outputs == [LAST_HIDDEN_STATE, POOLER_OUTPUT, f"cls_{LAYERS}", f"mean_{LAYERS}"]
    _assert_pooled_equal_numpy_pooling(last_only, range(LAYERS, LAYERS + 1))
    assert graphs.pooled_outputs(LAYERS, all_layers=False) == {
        "cls": {LAYERS: f"cls_{LAYERS}"},
        "mean": {LAYERS: f"mean_{LAYERS}"},
    }


def test_the_pooling_nodes_are_the_pooling_submodules_and_elementwise(tiny_model_dir: Path) -> None:
    model = onnx.load(str(tiny_model_dir / "encoder.fp32.onnx"))
    found = graphs.pooling_nodes(model)
    ops = {n.name: n.op_type for n in model.graph.node}
    assert {ops[n] for n in found} >= {"Gather", "Mul", "ReduceSum", "Div", "Clip"}
    assert {ops[n] for n in found} <= graphs.POOLING_OPS
    assert all(n.startswith("/pooling/") for n in found if ops[n] != "Constant")
    # Every node of the pooling submodule is found: none is left for fp16 to convert.
    assert {n for n in ops if n.startswith("/pooling/")} <= set(found)


def test_the_int8_pooling_nodes_are_the_fp32_ones(tiny_model_dir: Path) -> None:
    fp32 = graphs.pooling_nodes(onnx.load(str(tiny_model_dir / "encoder.fp32.onnx")))
    # Raises if a pooled output now depends on a quantised (integer) operator.
    assert graphs.pooling_nodes(onnx.load(str(tiny_model_dir / "encoder.int8.onnx"))) == fp32


def test_the_bert_fusions_still_fuse_every_layer(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The pooled outputs hang off every layer's output; the fusions must not stop at them."""
    fused = variants.fuse(tiny_model_dir / "encoder.fp32.onnx", tmp_path / "fused.onnx", HEADS, HIDDEN)
    assert fused == {
        "EmbedLayerNormalization": 1,
        "Attention": LAYERS,
        "BiasGelu": LAYERS,
        "SkipLayerNormalization": 2 * LAYERS,
    }
    fp16 = onnx.load(str(tiny_model_dir / "encoder.fp16.onnx"))
    ops = [n.op_type for n in fp16.graph.node]
    assert ops.count("Attention") == LAYERS and ops.count("SkipLayerNormalization") == 2 * LAYERS
    # The pooled outputs come straight from the float32 pooling, not through an fp16 round trip.
    producer = {o: n for n in fp16.graph.node for o in n.output}
    for mode in ALWAYS_POOLED:
        for layer in range(1, LAYERS + 1):
            assert producer[f"{mode}_{layer}"].name.startswith("/pooling/"), (mode, layer)


def test_a_pooled_output_made_by_a_matmul_is_refused() -> None:
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "x"], ["hidden_state_1"], name="layer"),
            helper.make_node("MatMul", ["hidden_state_1", "w"], ["mean_1"], name="pool_by_matmul"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor_value_info("hidden_state_1", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("mean_1", TensorProto.FLOAT, [2, 4]),
        ],
        [weight],
    )
    with pytest.raises(ValueError, match="MatMul node 'pool_by_matmul'"):
        graphs.pooling_nodes(helper.make_model(graph))


@pytest.mark.parametrize(
    ("name", "pooled"),
    [
        ("cls_1", True),
        ("mean_12", True),
        ("hidden_state_1", False),
        ("pooler_output", False),
        ("cls_x", False),
    ],
)
def test_pooled_output_names(name: str, pooled: bool) -> None:
    assert graphs.is_pooled_output(name) is pooled


def test_repeated_nodes_are_dropped_so_the_fp16_graph_loads() -> None:
    # onnxruntime.transformers before 1.32 writes one Cast per fp32 reader of a float16 tensor, each alike:
    # the graph fails to load ("two nodes with same node name") until the repeats go.
    def cast() -> onnx.NodeProto:
        return helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT, name="h_cast_to_fp32_node")

    nodes = [
        cast(),
        helper.make_node("Relu", ["h32"], ["a"]),
        cast(),
        helper.make_node("Neg", ["h32"], ["b"]),
    ]
    vector = [2]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT16, vector)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, vector) for n in ("a", "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="same node name"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    assert variants.drop_repeated_nodes(model.graph) == 1
    assert [n.op_type for n in model.graph.node] == ["Cast", "Relu", "Neg"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b = session.run(None, {"h": np.array([-1.0, 2.0], dtype=np.float16)})
    assert a.tolist() == [0.0, 2.0] and b.tolist() == [1.0, -2.0]
    assert variants.drop_repeated_nodes(model.graph) == 0
