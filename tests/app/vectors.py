"""The promise of docs/api.md ("The same vector for the same text"), in one place for the tests.

Two answers for the same input, computed in separately batched requests, agree to within
:data:`BATCHING_TOLERANCE` of the vector's length in every component: which other texts share a batch, and
so its padded length, may change the last bits of a mean-pooled vector (the in-graph sum over the padded
positions; tests/app/engine/test_batch_invariance.py measures it). Identical bytes are promised only where
the cache served the second answer, and the tests that check that compare bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# Per component, relative to the vector's length (so 1e-6 absolute on a unit vector): ~4x the worst
# difference measured across batchings (2.4e-7 of the largest component, fp32 and int8, mean pooling).
BATCHING_TOLERANCE = 1e-6


def assert_same_vectors(got: ArrayLike, want: ArrayLike, err_msg: str = "") -> None:
    """``got`` and ``want`` (vectors, or rows of them) are the same answer, batched apart: equal shapes,
    every component within :data:`BATCHING_TOLERANCE` of its row's length."""
    a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert a.shape == b.shape, f"{err_msg} shapes {a.shape} and {b.shape}"
    length = np.linalg.norm(b, axis=-1, keepdims=True).astype(np.float64)
    off = np.abs(a.astype(np.float64) - b) / np.maximum(length, np.finfo(np.float32).tiny)
    worst = float(off.max(initial=0.0))
    assert worst <= BATCHING_TOLERANCE, (
        f"{err_msg} {int((off > BATCHING_TOLERANCE).sum())} of {off.size} components differ by up to "
        f"{worst:.2e} of their vector's length (tolerance {BATCHING_TOLERANCE:.0e})"
    )


def assert_same_bits(packed: ArrayLike, floats: ArrayLike, signed: bool) -> None:
    """``packed`` (a ubinary or, with ``signed``, binary answer: bytes as numbers) holds the signs of
    ``floats`` (the float answer, batched apart): every bit is 1 where the component is above 0, except
    where the component is within :data:`BATCHING_TOLERANCE` of 0, where batching may flip its sign."""
    b = np.asarray(floats, np.float32)
    raw = np.asarray(packed, np.int16) + (128 if signed else 0)
    assert raw.min(initial=0) >= 0 and raw.max(initial=0) <= 255, "bytes out of range"
    bits = np.unpackbits(raw.astype(np.uint8), axis=-1)[..., : b.shape[-1]]
    assert bits.shape == b.shape, f"{bits.shape} bits for vectors of {b.shape}"
    length = np.linalg.norm(b, axis=-1, keepdims=True)
    sure = np.abs(b) > BATCHING_TOLERANCE * length
    assert np.array_equal(bits[sure], (b > 0)[sure]), (
        f"{int((bits[sure] != (b > 0)[sure]).sum())} bits differ"
    )


def assert_same_answer(got: Any, want: Any, where: str = "") -> None:
    """Two JSON answers are the same answer, computed apart: equal structure and strings, lists of floats
    the same vectors (:func:`assert_same_vectors`), other numbers within 1e-6 (scores)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for key in want:
            assert_same_answer(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list) and want and all(isinstance(x, float) for x in want):
        assert_same_vectors(got, want, where)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_answer(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert abs(got - want) <= 1e-6, (where, got, want)
    else:
        assert got == want, (where, got, want)
