"""Pooling: the vocabulary and the functions that pool a padded batch."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from app.engine import pooling


def test_mean_pool_ignores_padding() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    pooled = pooling.mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled[1], hidden[1, :2].mean(axis=0))
    np.testing.assert_allclose(pooling.cls_pool(hidden, mask), hidden[:, 0])


def test_pool_dispatches_by_mode_and_refuses_an_unknown_one() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(pooling.pool("cls", hidden, mask), hidden[:, 0])
    np.testing.assert_allclose(pooling.pool("mean", hidden, mask)[1], hidden[1, 0])
    with pytest.raises(KeyError):
        pooling.pool("no-such-mode", hidden, mask)  # not silently treated as mean


def test_every_mode_is_described_and_computed() -> None:
    modes = set(get_args(pooling.Pooling))
    assert set(pooling.DESCRIPTIONS) == modes
    assert set(pooling.POOLERS) == modes - {pooling.POOLER}
    assert all(mode in pooling.describe() for mode in modes)
