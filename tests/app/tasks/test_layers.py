"""Layer arithmetic: combination, window averages, normalisation, top-k."""

from __future__ import annotations

import numpy as np
import pytest

from app.errors import InternalError
from app.tasks import layers
from app.tasks.options import LayerMix, layer_mix


def test_combine_concat_and_mean() -> None:
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(layers.combine_layers(vectors, LayerMix("concat")), [1, 2, 3, 4])
    np.testing.assert_allclose(layers.combine_layers(vectors, LayerMix("mean")), [2, 3])


def test_top_k_is_sorted() -> None:
    probs = np.array([0.2, 0.5, 0.25, 0.05], dtype=np.float32)
    ids, scores = layers.top_k(probs, 3)
    assert ids == [1, 2, 0]
    assert scores == sorted(scores, reverse=True)
    assert layers.top_k(probs, 10)[0][:2] == [1, 2]  # k beyond the vocabulary: all of it


def test_weighted_and_difference_combine_pooled_vectors_and_token_rows_alike() -> None:
    rng = np.random.default_rng(0)
    stack = rng.standard_normal((3, 5, 4)).astype(np.float32)  # [layers, tokens, hidden]
    mix = layer_mix("weighted", 3, (1.0, 2.0, 1.0))
    assert mix.weights == (0.25, 0.5, 0.25)
    want = 0.25 * stack[0] + 0.5 * stack[1] + 0.25 * stack[2]
    np.testing.assert_allclose(layers.combine_layers(stack, mix), want, rtol=1e-6)
    np.testing.assert_allclose(layers.combine_layers(stack[:, 2], mix), want[2], rtol=1e-6)
    diff = layer_mix("difference", 2, None)
    np.testing.assert_array_equal(layers.combine_layers(stack[:2], diff), stack[0] - stack[1])
    concat = layers.combine_layers(stack, LayerMix("concat"))
    assert concat.shape == (5, 12)
    np.testing.assert_array_equal(concat[:, 4:8], stack[1])


def test_a_mix_validation_would_refuse_is_a_server_fault() -> None:
    stack = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(InternalError):
        layers.combine_layers(stack, LayerMix("difference"))
    with pytest.raises(InternalError):
        layers.combine_layers(stack, LayerMix("weighted", (1.0,)))


def test_rows_normalise() -> None:
    rows = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(layers.row_norms(rows), [5.0, 0.0])
    np.testing.assert_allclose(layers.normalize_rows(rows), [[0.6, 0.8], [0.0, 0.0]])


def test_input_vectors_average_an_inputs_windows_by_tokens() -> None:
    pooled = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[2.0, 2.0]]], dtype=np.float32)  # [seq, 1 layer, 2]
    owners, weights = np.array([0, 0, 1]), np.array([3, 1, 5])
    out = layers.input_vectors(2, pooled, LayerMix(), False, (owners, weights))
    np.testing.assert_allclose(out[0], [0.75, 0.25])
    np.testing.assert_allclose(out[1], [2.0, 2.0])
    normalized = layers.input_vectors(1, pooled[2:], LayerMix(), True)
    assert abs(np.linalg.norm(normalized[0]) - 1) < 1e-6


def test_input_vectors_combine_layers_for_every_input_at_once() -> None:
    rng = np.random.default_rng(1)
    pooled = rng.standard_normal((4, 2, 3)).astype(np.float32)  # [seq, layers, hidden]
    concat = layers.input_vectors(4, pooled, LayerMix("concat"), False)
    np.testing.assert_array_equal(concat, pooled.reshape(4, 6))
    diff = layers.input_vectors(4, pooled, LayerMix("difference"), False)
    np.testing.assert_array_equal(diff, pooled[:, 0] - pooled[:, 1])


def test_first_components_of_a_normalised_vector_equal_those_of_the_raw_one() -> None:
    # What lets the cache keep normalised whole vectors for every dimensions: normalize(cut(v)) equals
    # normalize(cut(v / |v|)).
    raw = np.random.default_rng(3).normal(size=(5, 64)).astype(np.float32) * 7
    cached = layers.normalize_rows(raw)
    for k in (1, 16, 32, 64):
        from_raw = layers.first_components(raw, k, True)
        from_cached = layers.first_components(cached, k, True)
        assert from_raw.shape == (5, k) and from_raw.dtype == np.float32
        np.testing.assert_allclose(from_cached, from_raw, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.linalg.norm(from_raw, axis=1), 1, rtol=1e-6)
        np.testing.assert_allclose(
            from_raw, raw[:, :k] / np.linalg.norm(raw[:, :k], axis=1, keepdims=True), rtol=1e-6
        )


def test_first_components_without_normalising_are_the_leading_values_contiguous() -> None:
    raw = np.arange(12, dtype=np.float32).reshape(2, 6)
    cut = layers.first_components(raw, 4, False)
    np.testing.assert_array_equal(cut, [[0, 1, 2, 3], [6, 7, 8, 9]])
    assert cut.flags.c_contiguous  # what orjson and the wire encodings write


def test_norms_and_unit_rows_are_the_bytes_of_the_linalg_formula() -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((9, 768)).astype(np.float32)
    rows[4] = 0  # a zero row stays zero
    rows[7, 3] = np.nan  # a NaN row is divided by 1, as np.where(norms > 0, norms, 1) said
    want_norms = np.linalg.norm(rows, axis=-1)
    assert layers.row_norms(rows).tobytes() == want_norms.tobytes()
    want = rows / np.where(want_norms[:, None] > 0, want_norms[:, None], 1)
    assert layers.normalize_rows(rows).tobytes() == want.tobytes()


def test_one_layer_combines_to_the_same_numbers_without_a_copy() -> None:
    stack = np.random.default_rng(4).standard_normal((1, 5, 16)).astype(np.float32)
    for how in ("concat", "mean"):
        got = layers.combine_layers(stack, LayerMix(how))
        assert got.tobytes() == np.concatenate(list(stack), axis=-1).tobytes() == stack.mean(axis=0).tobytes()
        assert np.shares_memory(got, stack) and got.flags.c_contiguous
