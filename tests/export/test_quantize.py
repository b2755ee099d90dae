"""The per-token int8 rewrite (export/quantize.py) on a one-MatMul graph, against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from app.model.manifest import ANY_CPU, VNNI
from app.model.runtime import cpu_has_vnni
from export import spec
from export.quantize import LEVELS_ANY_CPU, LEVELS_VNNI, _zero_point_rows, quantize_per_token
from export.spec import Int8Recipe

K, N = 48, 24


def _reference(
    x: np.ndarray, weight: np.ndarray, top: int = LEVELS_ANY_CPU - 1, rows: tuple[int, ...] = (-1,)
) -> np.ndarray:
    """Per-row activations (a row: the last axis, or ``rows``' axes), per-column symmetric int8 weights,
    exact integer product. 128 levels: each row its own zero point (asymmetric); 256: each row its own
    scale around one zero point, the middle level."""
    w_scale = np.maximum(np.abs(weight).max(axis=0), 1e-12) / 127
    wq = np.clip(np.rint(weight / w_scale), -127, 127)
    hi = np.maximum(x.max(axis=rows, keepdims=True), 0)
    lo = np.minimum(x.min(axis=rows, keepdims=True), 0)
    if top == LEVELS_VNNI - 1:
        zp = (top + 1) // 2
        scale = np.maximum(np.maximum(hi / (top - zp), lo / -zp), 1e-12)
    else:
        scale = np.maximum(hi - lo, 1e-12) / top
        zp = np.rint(-lo / scale)
    xq = np.clip(np.rint(x / scale) + zp, 0, top)
    return ((xq - zp) @ wq) * scale * w_scale


def _one_matmul(weight: np.ndarray, pooled: bool = False) -> onnx.ModelProto:
    """x @ weight; ``pooled``: then its max over the sequence, as the sparse graph's projection."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw" if pooled else "y"])]
    if pooled:
        nodes.append(helper.make_node("ReduceMax", ["xw"], ["y"], axes=[1], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, ["batch", N] if pooled else ["batch", "seq", N]
            )
        ],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[ort.InferenceSession, np.ndarray]:
    weight = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    folder = tmp_path_factory.mktemp("quantize")
    src, dst = folder / "fp32.onnx", folder / "int8.onnx"
    save(_one_matmul(weight), str(src))
    assert quantize_per_token(src, dst) == 1
    ops = [n.op_type for n in onnx.load(str(dst)).graph.node]
    assert "MatMul" not in ops and {"QuantizeLinear", "MatMulIntegerToFloat"} <= set(ops)
    return ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]), weight


def test_rows_are_quantised_like_the_reference(session: tuple[ort.InferenceSession, np.ndarray]) -> None:
    """Also catches an integer GEMM that saturates (u8 x s8 on CPUs without VNNI, with 256 levels)."""
    sess, weight = session
    x = np.random.default_rng(2).standard_normal((3, 5, K)).astype(np.float32) * 4
    x[0, 1] = 0  # an all-zero row (padding): scale must not be 0/0
    x[1, 2] = np.abs(x[1, 2])  # a one-sided row: asymmetric range, every level used
    (y,) = sess.run(["y"], {"x": x})
    np.testing.assert_allclose(y, _reference(x.astype(np.float64), weight), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y[0, 1], 0)
    rel = np.linalg.norm(y - x @ weight) / np.linalg.norm(x @ weight)
    assert rel < 0.02


def test_a_rows_result_does_not_depend_on_its_batch(session: tuple[ort.InferenceSession, np.ndarray]) -> None:
    sess, _ = session
    rng = np.random.default_rng(3)
    alone = rng.standard_normal((1, 4, K)).astype(np.float32)
    loud = rng.standard_normal((1, 4, K)).astype(np.float32) * 100  # would set a per-tensor scale
    (y_alone,) = sess.run(["y"], {"x": alone})
    (y_batched,) = sess.run(["y"], {"x": np.concatenate([alone, loud])})
    np.testing.assert_array_equal(y_alone[0], y_batched[0])


def test_zero_point_rows_add_up_to_minus_the_column_sums() -> None:
    colsum = np.array([0, 1, -1, 127 * 5, -127 * 5, 3001, -2999])
    rows = _zero_point_rows(colsum, 24)
    assert rows.dtype == np.int8 and rows.shape == (24, 7)
    np.testing.assert_array_equal(rows.astype(np.int64).sum(axis=0), -colsum)
    assert np.abs(rows.astype(np.int64)).max() <= 127
    with pytest.raises(ValueError, match="cannot hold"):
        _zero_point_rows(np.array([127 * 3 + 1]), 3)


@pytest.mark.parametrize(("cpu", "levels", "target"), [("any", 128, ANY_CPU), ("vnni", 256, VNNI)])
def test_the_recipe_records_levels_and_cpu(cpu: str, levels: int, target: str) -> None:
    recipe = Int8Recipe(cpu=cpu)  # type: ignore[arg-type]
    assert recipe.act_levels() == levels
    assert recipe.describe()["act_levels"] == levels and recipe.describe()["cpu"] == target


@pytest.mark.parametrize(("has_vnni", "levels"), [(False, 128), (True, 256)])
def test_auto_chooses_the_levels_by_the_exporting_cpu(
    monkeypatch: pytest.MonkeyPatch, has_vnni: bool, levels: int
) -> None:
    monkeypatch.setattr(spec, "cpu_has_vnni", lambda: has_vnni)
    assert Int8Recipe(cpu="auto").act_levels() == levels
    # A change of target changes the fingerprint: an export made elsewhere is redone here.
    assert Int8Recipe(cpu="auto").describe() != Int8Recipe(cpu="any" if has_vnni else "vnni").describe()


@pytest.mark.skipif(not cpu_has_vnni(), reason="256 levels are only exact on CPUs with VNNI")
def test_256_levels_are_exact_on_vnni(tmp_path: Path) -> None:
    weight = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    save(_one_matmul(weight), str(src))
    quantize_per_token(src, dst, levels=LEVELS_VNNI)
    ops = [n.op_type for n in onnx.load(str(dst)).graph.node]
    assert "Concat" not in ops  # one zero point for all rows: the GEMM takes it, nothing is appended
    x = np.random.default_rng(2).standard_normal((3, 5, K)).astype(np.float32) * 4
    x[0, 1] = 0
    x[1, 2] = np.abs(x[1, 2])
    (y,) = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    np.testing.assert_array_equal(y[0, 1], 0)
    expected = _reference(x.astype(np.float64), weight, LEVELS_VNNI - 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("levels", [LEVELS_ANY_CPU, LEVELS_VNNI])
def test_a_gemm_pooled_by_max_over_the_sequence_is_quantised_per_sequence(
    tmp_path: Path, levels: int
) -> None:
    """One scale a sequence, applied after the max: the max reads the GEMM's output directly; the result is
    the per-sequence reference, and a sequence's result does not depend on its batch."""
    if levels == LEVELS_VNNI and not cpu_has_vnni():
        pytest.skip("256 levels are only exact on CPUs with VNNI")
    weight = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    save(_one_matmul(weight, pooled=True), str(src))
    assert quantize_per_token(src, dst, levels=levels) == 1
    nodes = onnx.load(str(dst)).graph.node
    (gemm,) = (n for n in nodes if n.op_type == "MatMulIntegerToFloat")
    assert [n.op_type for n in nodes if gemm.output[0] in n.input] == ["ReduceMax"]
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((3, 5, K)).astype(np.float32) * 4
    x[1] = np.abs(x[1])  # a one-sided sequence
    (y,) = sess.run(["y"], {"x": x})
    expected = _reference(x.astype(np.float64), weight, levels - 1, rows=(1, 2)).max(axis=1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    loud = x[:1] * 100  # would set a per-tensor scale
    (y_batched,) = sess.run(["y"], {"x": np.concatenate([x[2:], loud])})
    np.testing.assert_array_equal(y[2], y_batched[0])
