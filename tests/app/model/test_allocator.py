"""The C heap's set-up: a fixed mmap threshold gives a freed batch buffer back; a trim gives the heap's
free pages back; the trimmer's count."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from app.model import allocator

glibc = pytest.mark.skipif(allocator._LIBC is None, reason="glibc's mallopt and malloc_trim")

# In a fresh process (glibc's threshold moves with what the process has freed before): free an 8 MB
# block (glibc raises its threshold to 8 MB), then allocate, touch and free eight blocks of 512 KiB, with
# small blocks allocated after them so the heap cannot shrink from its top; print how much resident
# memory that left behind, in KiB.
LEFT_BEHIND = textwrap.dedent(
    """
    import ctypes, sys
    from app.model import allocator
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "configure":
        assert allocator.configure(128)
    def rss_kib():
        return int(open("/proc/self/statm").read().split()[1]) * 4
    libc.free(libc.malloc(8 << 20))
    before = rss_kib()
    blocks = [libc.malloc(512 << 10) for _ in range(8)]
    keep = [libc.malloc(64) for _ in range(8)]  # small blocks between the large ones: no shrinking from the top
    for b in blocks:
        ctypes.memset(b, 1, 512 << 10)
    for b in blocks:
        libc.free(b)
    if sys.argv[1] == "trim":
        allocator.trim()
    print(rss_kib() - before)
    """
)


def left_behind_kib(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", LEFT_BEHIND, mode], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[-1])


@glibc
def test_glibc_alone_keeps_a_freed_buffer_and_both_remedies_give_it_back() -> None:
    kept = left_behind_kib("plain")
    assert kept >= 3 * 1024  # most of the 4 MB stays resident in the heap
    assert left_behind_kib("configure") < 1024
    assert left_behind_kib("trim") < 1024


def test_configure_off_or_without_glibc_does_nothing() -> None:
    assert allocator.configure(0) is False


def test_the_trimmer_trims_every_n_batches_and_never_when_off() -> None:
    every = allocator.Trimmer(3)
    for _ in range(7):
        every.after_batch()
    assert every.trims == 2
    never = allocator.Trimmer(0)
    for _ in range(10):
        never.after_batch()
    assert never.trims == 0
