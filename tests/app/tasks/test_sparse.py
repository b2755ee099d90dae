"""The sparse task's pieces: how a vector is kept in the cache, top_k (on a sparse vector and straight from
a dense one), and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from app.errors import ValidationFailed
from app.tasks.sparse import SAMPLE_STRIDE, SparseVector, check_top_k, pack, top_rows, unpack


def same(got: SparseVector, want: SparseVector) -> None:
    """``got`` holds ``want``'s entries, bit for bit, as int32 indices and float32 weights."""
    assert got.indices.dtype == np.int32 and got.values.dtype == np.float32
    assert got.indices.tolist() == want.indices.tolist()
    assert got.values.tolist() == want.values.tolist()


def dense_rows(seed: int, n: int = 6, vocab: int = 21128) -> np.ndarray:
    """``n`` SPLADE-like rows: mostly non-zero (as the random-weight twin's), a few weights repeated."""
    rng = np.random.default_rng(seed)
    rows = np.maximum(rng.normal(size=(n, vocab)), 0).astype(np.float32)
    rows[:, rng.choice(vocab, 40, replace=False)] = rows[0, 5]  # ties, also at the k-th for some k
    return rows


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


@pytest.mark.parametrize("seed", range(6))
def test_top_k_of_many_weights_keeps_what_a_stable_sort_keeps(seed: int) -> None:
    """~19,000 weights, as the twin's rows have (where top ranks only those above a sampled cut): all
    distinct, few distinct (ties at the k-th), and the largest all in the sample (the cut's fallback)."""
    rng = np.random.default_rng(seed)
    n = 19_000
    values = [
        rng.random(n, np.float32) + np.float32(0.01),
        rng.integers(1, 50, n).astype(np.float32),
        np.where(np.arange(n) % SAMPLE_STRIDE == 0, 2.0 + rng.random(n), rng.random(n)).astype(np.float32),
    ][seed % 3]
    v = SparseVector(np.sort(rng.choice(21128, n, replace=False)).astype(np.int32), values)
    for k in (1, 5, 256, 3000, n - 1):
        kept = np.sort(np.argsort(-values, kind="stable")[:k])
        same(v.top(k), SparseVector(v.indices[kept], values[kept]))


@pytest.mark.parametrize("k", [0, -3])
def test_a_top_k_under_one_is_refused(k: int) -> None:
    with pytest.raises(ValidationFailed, match=rf"top_k must be at least 1 .* not {k}"):
        check_top_k(k)
    check_top_k(None)
    check_top_k(1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [None, 1, 7, 256, 1000, 10_000, 21127, 21128, 10**6])
def test_largest_keeps_what_of_then_top_keeps(seed: int, k: int | None) -> None:
    for row in dense_rows(seed):
        same(SparseVector.largest(row, k), SparseVector.of(row).top(k))


def test_largest_ties_at_the_k_th_go_to_the_lower_index() -> None:
    row = np.zeros(21128, np.float32)
    row[::3] = 1.0  # 7,043 equal weights
    row[[100, 2000]] = 2.0
    top = SparseVector.largest(row, 5)
    assert top.indices.tolist() == [0, 3, 6, 100, 2000]
    same(top, SparseVector.of(row).top(5))


def test_largest_falls_back_where_the_sampled_cut_leaves_too_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose largest weights are all in the sample (the cut keeps fewer than k) and rows of fewer
    non-zeros than the sample's rank (the cut is 0) take the full pass, with the same answer; a row like
    the twin's does not."""
    full_passes: list[int] = []
    of = SparseVector.of

    def counted(vector: np.ndarray) -> SparseVector:
        full_passes.append(len(vector))
        return of(vector)

    monkeypatch.setattr(SparseVector, "of", counted)
    in_sample = np.full(21128, 0.5, np.float32)
    in_sample[::SAMPLE_STRIDE] = np.linspace(1, 2, len(in_sample[::SAMPLE_STRIDE]))
    few = np.zeros(21128, np.float32)
    few[[3, 90, 4000]] = [0.25, 0.5, 0.25]
    for row, k in ((in_sample, 256), (few, 1), (few, 3), (np.zeros(21128, np.float32), 1)):
        full_passes.clear()
        same(SparseVector.largest(row, k), of(row).top(k))
        assert full_passes == [21128]
    full_passes.clear()
    same(SparseVector.largest(in_sample, 3), of(in_sample).top(3))
    same(SparseVector.largest(dense_rows(0)[1], 256), of(dense_rows(0)[1]).top(256))
    assert full_passes == []


def test_top_rows_is_each_row_of_then_top() -> None:
    rows = dense_rows(9, n=4)
    for k in (None, 256):
        got = top_rows(rows, k)
        assert len(got) == len(rows)
        for row, vector in zip(rows, got, strict=True):
            same(vector, SparseVector.of(row).top(k))
