"""A simulated :class:`~app.engine.clock.Clock` for the batch queue's tests: time moves only when the test
(or a wait) moves it, so what the queue decides at each instant is exact, and no test sleeps."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from app.engine.clock import Clock


class FakeClock(Clock):
    """Simulated seconds. A wait takes no real time: it runs the next action scheduled within it (:meth:`at`),
    at its instant, and returns as a notify would; with none due it moves time to the wait's deadline.

    An action runs on the waiting thread with the queue's condition held (it is re-entrant), as an arrival
    from another thread would have run right then. A wait without a deadline and nothing scheduled is a
    real wait: another thread ends it (``stop``).
    """

    __slots__ = ("_actions", "_order", "t")

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._actions: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def at(self, delay: float, action: Callable[[], object]) -> None:
        """Run ``action`` once a wait reaches ``delay`` seconds from now."""
        heapq.heappush(self._actions, (self.t + delay, next(self._order), action))

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        actions = self._actions
        if actions and (timeout is None or actions[0][0] <= self.t + timeout):
            when, _, action = heapq.heappop(actions)
            self.t = max(self.t, when)
            action()
        elif timeout is None:
            cond.wait()
        else:
            self.t += timeout
