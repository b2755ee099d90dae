"""A process's memory as the worker bound (``worker_max_memory_mb``) counts it: PSS, else RSS.

PSS (proportional set size, ``/proc/PID/smaps_rollup``) charges each shared page to the processes that map
it in equal parts, so the workers' PSS add up to what they hold together; RSS (``/proc/PID/statm``) would
count a shared library once in each of them. Linux only: elsewhere nothing is measured.
"""

from __future__ import annotations

import os

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def memory_bytes(pid: int) -> int | None:
    """The PSS of process ``pid`` in bytes, its RSS where the kernel has no smaps_rollup (before 4.14)
    or refuses it; None when neither can be read (the process is gone, or this is not Linux)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES  # resident pages
    except (OSError, IndexError, ValueError):
        return None
