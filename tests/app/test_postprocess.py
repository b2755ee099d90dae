"""Post-processing in numpy: pooling, combination, averaging, normalisation, encodings, top-k."""

from __future__ import annotations

import base64

import numpy as np

from app.engine import postprocess


def test_mean_pool_ignores_padding() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    pooled = postprocess.mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled[1], hidden[1, :2].mean(axis=0))
    np.testing.assert_allclose(postprocess.cls_pool(hidden), hidden[:, 0])


def test_combine_average_and_normalize() -> None:
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(postprocess.combine_layers(vectors, "concat"), [1, 2, 3, 4])
    np.testing.assert_allclose(postprocess.combine_layers(vectors, "mean"), [2, 3])
    avg = postprocess.weighted_average([np.array([0.0, 0.0]), np.array([4.0, 8.0])], [3, 1])
    np.testing.assert_allclose(avg, [1, 2])
    assert abs(np.linalg.norm(postprocess.normalize(np.array([3.0, 4.0]))) - 1) < 1e-7
    np.testing.assert_array_equal(postprocess.normalize(np.zeros(2)), np.zeros(2))


def test_encodings_round_trip() -> None:
    v = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    assert postprocess.encode_vector(v, "float") == [0.5, -1.25, 3.0]
    raw = postprocess.encode_vector(v, "base64")
    assert isinstance(raw, str)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(raw), "<f4"), v)
    q = postprocess.encode_vector(v, "int8")
    assert isinstance(q, dict)
    values, scale = np.asarray(q["values"]), float(q["scale"])  # type: ignore[arg-type]
    assert values[2] == 127
    np.testing.assert_allclose(values * scale, v, atol=scale / 2)
    zero = postprocess.encode_vector(np.zeros(3, np.float32), "int8")
    assert zero == {"values": [0, 0, 0], "scale": 1.0}


def test_top_k_is_sorted_and_softmax_sums_to_one() -> None:
    probs = postprocess.softmax(np.array([[1.0, 3.0, 2.0, 0.0]], dtype=np.float32))[0]
    assert abs(probs.sum() - 1) < 1e-6
    ids, scores = postprocess.top_k(probs, 3)
    assert ids == [1, 2, 0] and scores == sorted(scores, reverse=True)
