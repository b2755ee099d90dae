"""ONNX Runtime's one intra-op thread pool per process, which the sessions of several models share.

A service of several models runs their batches on one inference thread, one batch at a time
(:mod:`app.engine.scheduler`): one pool of every core serves all of them, where a pool per session would
keep a set of threads per model spinning on the same cores. ONNX Runtime makes the global pool once per
process and refuses to replace it; once it exists, it also refuses any session a pool of its own (only a
process that serves more than once, as the tests do, opens a model of one after several: it then runs on
the shared pool too).
"""

from __future__ import annotations

import logging

import onnxruntime as ort

log = logging.getLogger(__name__)

# The intra-op threads of this process's pool once it is made; None before.
_threads: int | None = None


def made() -> bool:
    """Whether this process has the shared pool."""
    return _threads is not None


def share(options: ort.SessionOptions, intra_op_threads: int) -> None:
    """Have a session opened with ``options`` run on the process's pool, made now with
    ``intra_op_threads`` threads (0: every physical core) if it is not yet (a later size is ignored, with a
    warning)."""
    global _threads
    if _threads is None:
        ort.set_global_thread_pool_sizes(intra_op_threads, 1)
        _threads = intra_op_threads
    elif _threads != intra_op_threads:
        log.warning(
            "ONNX Runtime's shared thread pool has %d intra-op threads; it cannot be remade with %d",
            _threads,
            intra_op_threads,
        )
    options.use_per_session_threads = False
    options.intra_op_num_threads = options.inter_op_num_threads = 0  # the pool's, not these
