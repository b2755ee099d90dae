"""The C heap of a process that runs many batch shapes: glibc's allocator set up so freed memory goes back.

Every batch allocates its activations anew (ONNX Runtime's buffers, the inputs and outputs), a few MB
to some hundred MB depending on its shape, and frees them when it has run. glibc serves a block of
``M_MMAP_THRESHOLD`` or more with its own ``mmap`` and unmaps it on free; smaller ones come from the
heap, which keeps what is freed. Left to itself glibc *raises* that threshold to the size of each large
block freed (up to 32 MB), so after the first few batches the activations come from the heap, and with
each new mix of shapes the heap fragments and grows: a worker's memory rose 2-4 MB a minute for as long as
it served (docs/performance-log.md, "python -m loadtest.memory"). Two remedies, both on by default:

- :func:`configure` fixes the threshold (``mallopt``; a fixed value also turns glibc's raising off), so
  a batch's large buffers are mapped and unmapped with it;
- :class:`Trimmer` calls ``malloc_trim(0)`` on the inference thread every so many batches, giving back
  the free pages inside the heap that the smaller blocks leave.

Not glibc (musl, macOS): both are no-ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt(3)
M_MMAP_THRESHOLD = -3


def _libc() -> Any | None:
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
            return libc
    return None


_LIBC = _libc()


def configure(mmap_threshold_kb: int) -> bool:
    """Blocks of ``mmap_threshold_kb`` KiB or more are mapped on their own from now on, and free memory
    above that at the heap's top goes back at once (0: glibc's own rules); whether the settings took.

    Both thresholds: glibc raises the trim threshold with the mmap threshold (to twice it), and by the time
    a model loads the imports before it have raised both; fixing only the mmap threshold leaves the heap's
    top kept up to that raised value.
    """
    if _LIBC is None or mmap_threshold_kb <= 0:
        return False
    size = mmap_threshold_kb * 1024
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, size)) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, size))


def trim() -> None:
    """Give the heap's free pages back to the OS (glibc keeps them otherwise)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class Trimmer:
    """Trims the heap every ``every`` batches (0: never); counts the trims and their seconds."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.trims = 0
        self.seconds = 0.0
        self._since = 0

    def after_batch(self) -> None:
        if self.every <= 0:
            return
        self._since += 1
        if self._since < self.every:
            return
        self._since = 0
        started = time.perf_counter()
        trim()
        self.seconds += time.perf_counter() - started
        self.trims += 1
