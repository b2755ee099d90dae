"""The time batch assembly decides by, read and waited on through one object a test may simulate.

A sequence's ``enqueued_at`` must be read from the engine's clock, never from ``time``; durations (a
batch's run, tokenising) measure real time.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """Real time: ``time.perf_counter`` seconds, and waits on the condition itself."""

    __slots__ = ()

    now = staticmethod(time.perf_counter)

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(timeout)
