"""Stage 1, admission: a non-blocking permit per input, taken before any work is queued.

The bound (``max_concurrent_inputs``) is also what bounds every queue behind it: nothing enters the
tokenisation or batch queues without permits, so they can never hold more than the bound's worth. With
several workers the bound is the server's, not each worker's: their permits are counted in one shared
ledger, so a request is refused only when the whole server is full.

One budget serves every urgency, but a less urgent request stops short of its end
(:func:`app.engine.priority.admission_limit`: a background request, ``u=7``, may fill half of it), so a bulk
client is refused with 429 while interactive requests are still admitted.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Protocol

from app.engine.priority import DEFAULT_URGENCY, admission_limit
from app.errors import Overloaded


class Permits:
    """Permits held by one request; release them with ``with`` or :meth:`release` (idempotent)."""

    def __init__(self, admission: Admission, count: int) -> None:
        self._admission = admission
        self.count = count
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._give_back(self.count)

    def __enter__(self) -> Permits:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Ledger(Protocol):
    """Where the permits in use are counted: one process, or every worker of one server."""

    def try_take(self, count: int, limit: int) -> bool:
        """Add ``count`` if the total stays within ``limit``; whether it did."""
        ...

    def give_back(self, count: int) -> int:
        """Subtract ``count``; the total after."""
        ...

    def total(self) -> int: ...


class LocalLedger:
    """Permits of one process, under a thread lock."""

    def __init__(self) -> None:
        self._in_use = 0
        self._lock = threading.Lock()

    def try_take(self, count: int, limit: int) -> bool:
        with self._lock:
            if self._in_use + count > limit:
                return False
            self._in_use += count
            return True

    def give_back(self, count: int) -> int:
        with self._lock:
            self._in_use -= count
            return self._in_use

    def total(self) -> int:
        return self._in_use


class Admission:
    def __init__(self, limit: int, ledger: Ledger | None = None, model: str | None = None) -> None:
        """``ledger`` counts the permits in use; a :class:`LocalLedger` unless the server has several
        workers, which share one (:class:`app.serving.cluster.SharedLedger`) so the limit is the server's.
        ``model``: whose budget this is, in a service of several (each has its own, and a 429 says whose)."""
        self.limit = limit
        self.model = model
        self.ledger: Ledger = ledger if ledger is not None else LocalLedger()
        self.rejected = 0  # requests refused, for /info and tests

    @property
    def in_use(self) -> int:
        return self.ledger.total()

    def try_acquire(self, count: int, urgency: int = DEFAULT_URGENCY) -> Permits:
        """Take ``count`` permits at once or none, for a request of ``urgency``.

        Raises:
            Overloaded: fewer than ``count`` permits are free to a request of this urgency.
        """
        if count < 1:
            raise ValueError(f"a request takes at least one permit, not {count}")
        limit = admission_limit(self.limit, urgency)
        if not self.ledger.try_take(count, limit):
            self.rejected += 1
            share = (
                "" if limit == self.limit else f", of which requests of urgency {urgency} may fill {limit}"
            )
            whose = f"model {self.model}'s budget is full: " if self.model is not None else ""
            raise Overloaded(
                f"{whose}{self.ledger.total()} of {self.limit} inputs in flight{share}; {count} more do not "
                "fit, retry later"
            )
        return Permits(self, count)

    def join(self, ledger: Ledger) -> None:
        """Count permits in ``ledger`` from now on: the server's, once this worker is warm. The warm-up
        counts its own, so that a replacement started while the server is full still warms up.

        Raises:
            RuntimeError: permits are still held in the ledger it leaves.
        """
        if self.ledger.total() != 0:
            raise RuntimeError(f"admission joined another ledger with {self.ledger.total()} permits held")
        self.ledger = ledger

    def _give_back(self, count: int) -> None:
        if self.ledger.give_back(count) < 0:
            raise RuntimeError("admission released more permits than it gave out")
