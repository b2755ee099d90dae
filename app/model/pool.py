"""ONNX Runtime's one intra-op thread pool per process, which the sessions of several models share.

A service of several models runs their batches on one inference thread, one batch at a time
(:mod:`app.engine.scheduler`), but for short batches of the other models that run beside it on express
threads: one pool serves all of them, where a pool per session would keep a set of threads per model
spinning on the same cores. Unless ``intra_op_threads`` is set, the pool takes every physical core but one
(:func:`threads`). ONNX Runtime makes the global pool once per process and refuses to replace it; once it
exists, it also refuses any session a pool of its own (only a process that serves more than once, as the
tests do, opens a model of one after several: it then runs on the shared pool too).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger(__name__)

# The intra-op threads of this process's pool once it is made; None before.
_threads: int | None = None
CPUS = Path("/sys/devices/system/cpu")


def made() -> bool:
    """Whether this process has the shared pool."""
    return _threads is not None


def physical_cores(cpus: Path = CPUS) -> int:
    """The physical cores among the CPUs this process may run on (two hyperthreads of one core count once);
    the CPUs themselves where the topology cannot be read."""
    allowed = os.sched_getaffinity(0)
    cores = set()
    try:
        for cpu in allowed:
            topology = cpus / f"cpu{cpu}" / "topology"
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
    except OSError:
        return len(allowed)
    return len(cores)


def threads(intra_op_threads: int, cores: int | None = None) -> int:
    """The shared pool's size for the ``intra_op_threads`` setting: the setting where one is given, else
    every physical core but one, at least one (``cores``: the physical cores; default, this machine's).

    The core left over is for what runs beside a batch in a process of several models: the other models'
    short batches on the express threads, the event loop serving every model's requests, tokenisation.
    With every core in the pool, each of a batch's operators is split across all of them, and (the likely
    cause of what docs/performance-log.md, "Several models in one process", measures) waits for the share
    of a thread the OS gave to that other work."""
    if intra_op_threads:
        return intra_op_threads
    return max(1, (cores if cores is not None else physical_cores()) - 1)


def share(options: ort.SessionOptions, intra_op_threads: int) -> int:
    """Have a session opened with ``options`` run on the process's pool, made now with
    :func:`threads` ``(intra_op_threads)`` threads if it is not yet (a later size is ignored, with a
    warning); the pool's size."""
    global _threads
    size = threads(intra_op_threads)
    if _threads is None:
        ort.set_global_thread_pool_sizes(size, 1)
        _threads = size
        log.info("ONNX Runtime's shared thread pool: %d intra-op threads", size)
    elif _threads != size:
        log.warning(
            "ONNX Runtime's shared thread pool has %d intra-op threads; it cannot be remade with %d",
            _threads,
            size,
        )
    options.use_per_session_threads = False
    options.intra_op_num_threads = options.inter_op_num_threads = 0  # the pool's, not these
    return _threads
