"""The sparse task's pieces: how a vector is kept in the cache, top_k, and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from app.errors import ValidationFailed
from app.tasks.sparse import SparseVector, check_top_k, pack, unpack


def test_a_vector_packs_to_its_non_zero_entries_and_back() -> None:
    vector = np.zeros(21128, np.float32)
    vector[[3, 17, 21127]] = [0.5, 2.25, 1e-6]
    packed = pack(vector)
    assert packed.dtype == np.float32 and packed.nbytes == 6 * 4  # three indices and three weights
    back = unpack(np.frombuffer(packed.tobytes(), np.float32))  # as the cache hands it back: read-only bytes
    assert back.indices.dtype == np.int32 and back.indices.tolist() == [3, 17, 21127]
    assert back.values.tolist() == [0.5, 2.25, np.float32(1e-6)]
    empty = unpack(pack(np.zeros(8, np.float32)))
    assert len(empty.indices) == len(empty.values) == 0


def test_top_k_keeps_the_largest_in_index_order_ties_to_the_lower_index() -> None:
    v = SparseVector(np.array([2, 5, 9, 11], np.int32), np.array([0.3, 0.9, 0.3, 0.1], np.float32))
    top = v.top(2)
    assert top.indices.tolist() == [2, 5] and top.values.tolist() == [np.float32(0.3), np.float32(0.9)]
    assert v.top(None) is v and v.top(4) is v and v.top(10) is v
    assert v.top(1).indices.tolist() == [5]


@pytest.mark.parametrize("seed", range(20))
def test_top_k_keeps_what_a_stable_sort_by_weight_keeps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    # Even seeds: few distinct weights (many ties at the k-th); odd: all distinct.
    values = (rng.integers(1, 6, n) if seed % 2 == 0 else rng.random(n) + 0.01).astype(np.float32)
    v = SparseVector(np.sort(rng.choice(21128, n, replace=False)).astype(np.int32), values)
    for k in {1, int(rng.integers(1, n + 1)), n}:
        kept = np.sort(np.argsort(-values, kind="stable")[:k])
        top = v.top(k)
        assert top.indices.tolist() == v.indices[kept].tolist()
        assert top.values.tolist() == values[kept].tolist()


@pytest.mark.parametrize("k", [0, -3])
def test_a_top_k_under_one_is_refused(k: int) -> None:
    with pytest.raises(ValidationFailed, match=rf"top_k must be at least 1 .* not {k}"):
        check_top_k(k)
    check_top_k(None)
    check_top_k(1)
