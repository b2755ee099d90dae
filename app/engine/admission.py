"""Stage 1, admission: a non-blocking permit per input, taken before any work is queued.

The bound (``max_concurrent_inputs``) is also what bounds every queue behind it: nothing enters the
tokenisation or batch queues without permits, and a request's permits are given back only once none of
its work is left in a queue (:class:`Permits`), so they can never hold more than the bound's worth. With
several workers the bound is the server's, not each worker's: their permits are counted in one shared
ledger, so a request is refused only when the whole server is full.

One budget serves every urgency, but a less urgent request stops short of its end
(:func:`app.engine.priority.admission_limit`: a background request, ``u=7``, may fill half of it), so a bulk
client is refused with 429 while interactive requests are still admitted.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Protocol

from app.engine.priority import DEFAULT_URGENCY, admission_limit
from app.errors import Overloaded


class Permits:
    """Permits held by one request, given back once the request is done with them (``with``, or
    :meth:`release`, idempotent) AND every stage holding some of its work has let go (:meth:`keep`,
    :meth:`let_go`): a request whose client left keeps them while its texts still wait in the tokenisation
    queue, so that a new request cannot take them and find that queue full. (The batch queue needs no
    hold: a cancelled or failed request's sequences are dropped from it before its ``with`` ends.)

    While its ``with`` block runs they are :data:`HELD` in the request's task, for the stages to find.
    """

    __slots__ = ("_admission", "_holds", "_released", "_token", "count")

    def __init__(self, admission: Admission, count: int) -> None:
        self._admission = admission
        self.count = count
        self._holds = 1  # the request's own; a stage holding its work adds one (keep) until it lets go
        self._released = False
        self._token: Token[Permits | None] | None = None

    @property
    def admission(self) -> Admission:
        return self._admission

    def keep(self) -> None:
        """A stage holds some of the request's work: the permits stay taken until it lets go. Only while
        the request holds them (in its ``with`` block)."""
        with self._admission.lock:
            if self._holds == 0:
                raise RuntimeError("a stage kept permits already given back")
            self._holds += 1

    def let_go(self) -> None:
        """A holder is done (from any thread); the last one gives the permits back."""
        with self._admission.lock:
            self._holds -= 1
            last = self._holds == 0
        if last:
            self._admission._give_back(self.count)

    def release(self) -> None:
        """The request is done with them; given back now unless a stage still holds some of its work."""
        with self._admission.lock:
            if self._released:
                return
            self._released = True
        self.let_go()

    def __enter__(self) -> Permits:
        self._token = HELD.set(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            HELD.reset(self._token)
            self._token = None
        self.release()


# The permits of the request served in this task, while its ``with`` block runs: a stage that queues its
# work keeps them until the work has left its queue (:meth:`app.engine.engine.Engine.held`).
HELD: ContextVar[Permits | None] = ContextVar("zhembed_permits", default=None)


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
        # Guards each request's count of holders (Permits), changed on the loop and the stage threads.
        self.lock = threading.Lock()

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
