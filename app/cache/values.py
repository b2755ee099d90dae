"""What a cached value is: the raw little-endian float32 bytes of one output, as wide as its key's output.

Both tiers hold bytes that something else may have written (another build under the same key space, a
hand-edited Redis, a digest that once left something out): a value that does not fit is dropped from its
tier and computed again, never served and never a 500.
"""

from __future__ import annotations

import numpy as np

DTYPE = np.dtype("<f4")

# Why a value is dropped (the ``reason`` of ``zhembed_cache_rejected_total``).
SIZE = "size"  # not whole float32 numbers
WIDTH = "width"  # float32 numbers, but not as many as the key's output has


def misfit(value: bytes, width: int | None) -> str | None:
    """Why ``value`` cannot be the output of ``width`` float32 numbers (None: any number, for outputs of
    varying length), or None when it can."""
    size = len(value)
    if width is not None:
        return None if size == width * DTYPE.itemsize else (SIZE if size % DTYPE.itemsize else WIDTH)
    return SIZE if size % DTYPE.itemsize else None
