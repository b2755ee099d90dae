"""How late the event loop runs what is due: a task that sleeps a short interval, again and again, and
reports how much later than asked it woke (``zhembed_event_loop_lag_seconds``).

A callback that holds the loop for D seconds delays the next wake-up due while it runs by up to D: a
request's work done on the loop instead of beside it shows here, and as the same wait on every other
request of the worker (``/health`` included). Started with each worker's event loop, in the lifespan.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

# Seconds between wake-ups: 20 a second, ~10 µs of the loop's time each (0.02 %); a hold of the loop
# longer than this is always seen, a shorter one when it spans a wake-up.
INTERVAL_S = 0.05


class LoopLag:
    """Measures the lag of the loop it runs on.

    Args:
        observe: takes each lag, in seconds (``Metrics.loop_lag``).
        interval_s: the sleep between measurements.
        clock: seconds, monotonic (a test's fake).
        sleep: the loop's sleep (a test's fake, advancing the fake clock).
    """

    def __init__(
        self,
        observe: Callable[[float], None],
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.observe = observe
        self.interval_s = interval_s
        self.clock = clock
        self.sleep = sleep

    async def tick(self) -> float:
        """Sleep one interval; report and return how much later than asked it woke (never below 0)."""
        asked = self.clock() + self.interval_s
        await self.sleep(self.interval_s)
        lag = max(0.0, self.clock() - asked)
        self.observe(lag)
        return lag

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            await self.tick()

    def start(self) -> asyncio.Task[None]:
        """:meth:`run` as a task of the running loop (the caller cancels it when the loop's app stops)."""
        return asyncio.get_running_loop().create_task(self.run(), name="zhembed-loop-lag")
