"""Post-processing in numpy: pooling, combination, averaging, normalisation, encodings, top-k."""

from __future__ import annotations

import base64
import re

import numpy as np
import orjson
import pytest

from app.engine import postprocess
from app.engine.postprocess import LayerMix
from app.errors import ValidationFailed


def test_mean_pool_ignores_padding() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    pooled = postprocess.mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled[1], hidden[1, :2].mean(axis=0))
    np.testing.assert_allclose(postprocess.cls_pool(hidden), hidden[:, 0])


def test_combine_average_and_normalize() -> None:
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(postprocess.combine_layers(vectors, LayerMix("concat")), [1, 2, 3, 4])
    np.testing.assert_allclose(postprocess.combine_layers(vectors, LayerMix("mean")), [2, 3])
    avg = postprocess.weighted_average([np.array([0.0, 0.0]), np.array([4.0, 8.0])], [3, 1])
    np.testing.assert_allclose(avg, [1, 2])
    assert abs(np.linalg.norm(postprocess.normalize(np.array([3.0, 4.0]))) - 1) < 1e-7
    np.testing.assert_array_equal(postprocess.normalize(np.zeros(2)), np.zeros(2))


def test_encodings_round_trip() -> None:
    v = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    as_float = postprocess.encode_vector(v, "float")
    assert isinstance(as_float, np.ndarray) and as_float.dtype == np.float32
    np.testing.assert_array_equal(as_float, v)
    raw = postprocess.encode_vector(v, "base64")
    assert isinstance(raw, str)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(raw), "<f4"), v)
    q = postprocess.encode_vector(v, "int8")
    assert isinstance(q, dict)
    values, scale = np.asarray(q["values"]), float(q["scale"])  # type: ignore[arg-type]
    assert values[2] == 127
    np.testing.assert_allclose(values * scale, v, atol=scale / 2)
    zero = postprocess.encode_vector(np.zeros(3, np.float32), "int8")
    assert isinstance(zero, dict) and zero["scale"] == 1.0
    np.testing.assert_array_equal(zero["values"], [0, 0, 0])  # type: ignore[arg-type]


def test_float32_json_is_shortest_and_exact() -> None:
    """What the routes write: each float32 in its shortest decimal form, read back bit for bit."""
    v = np.array([0.1, -1.0 / 3.0, 1e-8, 123456.78], dtype=np.float32)
    payload = [postprocess.encode_vector(v, "float"), postprocess.encode_vector(v, "int8")]
    text = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    assert text.startswith(b"[[0.1,")  # float32(0.1) printed as a double would be 0.10000000149011612
    back = orjson.loads(text)
    np.testing.assert_array_equal(np.array(back[0], dtype=np.float32), v)
    assert back[1]["values"][0] == round(0.1 / (123456.78 / 127))


def test_top_k_is_sorted_and_softmax_sums_to_one() -> None:
    probs = postprocess.softmax(np.array([[1.0, 3.0, 2.0, 0.0]], dtype=np.float32))[0]
    assert abs(probs.sum() - 1) < 1e-6
    ids, scores = postprocess.top_k(probs, 3)
    assert ids == [1, 2, 0] and scores == sorted(scores, reverse=True)


def test_weighted_and_difference_combine_pooled_vectors_and_token_rows_alike() -> None:
    rng = np.random.default_rng(0)
    stack = rng.standard_normal((3, 5, 4)).astype(np.float32)  # [layers, tokens, hidden]
    mix = postprocess.layer_mix("weighted", 3, (1.0, 2.0, 1.0))
    assert mix.weights == (0.25, 0.5, 0.25)
    want = 0.25 * stack[0] + 0.5 * stack[1] + 0.25 * stack[2]
    np.testing.assert_allclose(postprocess.combine_layers(stack, mix), want, rtol=1e-6)
    np.testing.assert_allclose(postprocess.combine_layers(stack[:, 2], mix), want[2], rtol=1e-6)
    diff = postprocess.layer_mix("difference", 2, None)
    np.testing.assert_array_equal(postprocess.combine_layers(stack[:2], diff), stack[0] - stack[1])
    concat = postprocess.combine_layers(stack, LayerMix("concat"))
    assert concat.shape == (5, 12)
    np.testing.assert_array_equal(concat[:, 4:8], stack[1])


def test_weights_are_scaled_without_overflow() -> None:
    assert postprocess.layer_mix("weighted", 2, (1e308, 1e308)).weights == (0.5, 0.5)
    assert postprocess.layer_mix("weighted", 2, (0.0, 3.0)).weights == (0.0, 1.0)


@pytest.mark.parametrize(
    ("how", "layers", "weights", "words"),
    [
        ("weighted", 2, None, "needs layer_weights"),
        ("weighted", 2, (1.0,), "1 weights for 2 layers"),
        ("weighted", 2, (1.0, -1.0), "layer_weights[1] is -1.0"),
        ("weighted", 2, (float("nan"), 1.0), "layer_weights[0] is nan"),
        ("weighted", 2, (float("inf"), 1.0), "layer_weights[0] is inf"),
        ("weighted", 2, (0.0, 0.0), "all 0"),
        ("mean", 2, (1.0, 1.0), "'weighted' only"),
        ("difference", 3, None, "got 3"),
        ("difference", 1, None, "got 1"),
    ],
)
def test_layer_mix_refuses_what_does_not_fit(
    how: postprocess.LayerCombine, layers: int, weights: tuple[float, ...] | None, words: str
) -> None:
    with pytest.raises(ValidationFailed, match=re.escape(words)):
        postprocess.layer_mix(how, layers, weights)


def test_rows_normalise_and_encode() -> None:
    rows = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(postprocess.row_norms(rows), [5.0, 0.0])
    np.testing.assert_allclose(postprocess.normalize_rows(rows), [[0.6, 0.8], [0.0, 0.0]])
    np.testing.assert_array_equal(postprocess.encode_rows(rows, "float"), rows)
    encoded = postprocess.encode_rows(rows, "base64")
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded[0]), "<f4"), rows[0])
    assert orjson.dumps(postprocess.encode_rows(rows, "float"), option=orjson.OPT_SERIALIZE_NUMPY) == (
        b"[[3.0,4.0],[0.0,0.0]]"
    )
    assert len(postprocess.encode_rows(np.zeros((0, 2), np.float32), "float")) == 0
