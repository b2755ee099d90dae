"""The time batch assembly decides by: read, and waited on, through one small object.

:class:`~app.engine.batching.Batcher` reads the time (when a sequence arrived, how long the oldest has
waited, how long since a class was last served) and waits (for any sequence, or for company until a
deadline) only through a :class:`Clock`, so a test can hand it a simulated one whose waits take no time
and whose arrivals come at the instants it names, and assert the exact decisions. The real one costs what
calling ``time.perf_counter`` and ``Condition.wait`` directly did: ``now`` *is* ``time.perf_counter``.

A sequence's ``enqueued_at`` must be read from the same clock (the engine reads it from the batcher's).
"""

from __future__ import annotations

import resource
import threading
import time


class Clock:
    """Real time: ``time.perf_counter`` seconds, and waits on the condition itself."""

    __slots__ = ()

    now = staticmethod(time.perf_counter)

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified, or ``timeout`` seconds (None: no limit)."""
        cond.wait(timeout)


_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def thread_cpu_seconds() -> float:
    """This thread's CPU seconds (user + system), read with ``getrusage``, not ``time.thread_time``.

    ``thread_time``'s ``clock_gettime(CLOCK_THREAD_CPUTIME_ID)`` first brings the scheduler's count of the
    running thread up to date, and an EEVDF scheduler (Linux 6.6 on) that then finds the thread's slice
    spent deschedules it right there, on its way out of the call. Read right after a model run (which
    spends the slice), that happens with the interpreter lock held, and every other Python thread waits
    for it: 40-100 stalls of 1-6 ms in 20,000 reads by a busy thread beside a running session, none with
    ``getrusage``, whose figure is the count as of the thread's last tick or switch (within 0.3% of
    ``thread_time``'s over a few hundred runs). Elsewhere, ``thread_time``."""
    if _THREAD is None:
        return time.thread_time()
    usage = resource.getrusage(_THREAD)
    return usage.ru_utime + usage.ru_stime
