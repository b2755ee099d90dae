"""loadtest.memory's readings: private memory by kind of mapping adds up to the whole, and grows with
what the process holds."""

from __future__ import annotations

import numpy as np

from loadtest.memory import VARIANTS, uss_by_kind, uss_mb


def test_private_memory_by_kind_adds_up_and_sees_an_allocation() -> None:
    before = uss_by_kind()
    assert abs(sum(before.values()) - uss_mb()) < 8  # the same pages, read a moment apart
    held = np.ones(64 * 2**20 // 8)  # 64 MB, touched
    after = uss_by_kind()
    assert after["anon"] + after["heap"] - before["anon"] - before["heap"] > 48
    del held


def test_every_variant_turns_off_what_its_name_says() -> None:
    assert VARIANTS["default"] == {}
    assert VARIANTS["trim-off"] == {"ZHEMBED_MEMORY_TRIM_BATCHES": "0", "ZHEMBED_MMAP_THRESHOLD_KB": "0"}
    assert VARIANTS["mmap-env"]["MALLOC_MMAP_THRESHOLD_"] == "131072"
