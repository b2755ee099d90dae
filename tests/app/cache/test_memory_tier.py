"""The in-process LRU: bounded in bytes, least recently used out first, and honest about its size."""

from __future__ import annotations

import tracemalloc

import numpy as np

from app.cache.memory_tier import MemoryLRU


def test_evicts_least_recently_used_to_stay_in_bounds() -> None:
    value = bytes(1000)
    cost = MemoryLRU.cost("k0", value)
    lru = MemoryLRU(max_bytes=3 * cost)
    for i in range(3):
        lru.put(f"k{i}", value)
    assert lru.get("k0") == value  # k0 is now the most recently used
    lru.put("k3", value)
    assert lru.get("k1") is None
    assert [lru.get(k) is not None for k in ("k0", "k2", "k3")] == [True, True, True]
    assert lru.bytes == 3 * cost <= lru.max_bytes


def test_refreshing_a_key_keeps_the_count_right_and_oversize_is_refused() -> None:
    lru = MemoryLRU(max_bytes=10_000)
    lru.put("k", bytes(100))
    lru.put("k", bytes(200))
    assert len(lru) == 1 and lru.bytes == MemoryLRU.cost("k", bytes(200))
    lru.put("big", bytes(20_000))
    assert lru.get("big") is None and len(lru) == 1


def test_accounted_bytes_match_what_python_holds() -> None:
    """10,000 vectors of 768 float32: the accounting is within 10% of the traced allocations."""
    lru = MemoryLRU(max_bytes=1 << 30)
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(768).astype("<f4") for _ in range(100)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(10_000):
        lru.put(f"zhembed:v1:0123456789abcdef:0123456789abcdef:{i:032x}", vectors[i % 100].tobytes())
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert abs(lru.bytes - held) / held < 0.10, (lru.bytes, held)
