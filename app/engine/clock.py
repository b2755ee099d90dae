"""The time batch assembly decides by: read, and waited on, through one small object.

The batch queue (:class:`~app.engine.batching.Batcher`) reads the time (when a sequence arrived, how long
the oldest has waited, how long since a class was last served) and the scheduler that serves it
(:class:`~app.engine.scheduler.Scheduler`) waits (for any sequence, or for company until a deadline) only
through a :class:`Clock`, so a test can hand it a simulated one whose waits take no time and whose
arrivals come at the instants it names, and assert the exact decisions. The real one costs what
calling ``time.perf_counter`` and ``Condition.wait`` directly did: ``now`` *is* ``time.perf_counter``.

A sequence's ``enqueued_at`` must be read from the same clock: the engine's (``Engine.clock``, which its
batch queue and its tokenisation queue's aging read too), never from ``time``; zero is a time like any
other. Durations (a batch's run, tokenising) measure real time: they are the machine's.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """Real time: ``time.perf_counter`` seconds, and waits on the condition itself."""

    __slots__ = ()

    now = staticmethod(time.perf_counter)

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified, or ``timeout`` seconds (None: no limit)."""
        cond.wait(timeout)
