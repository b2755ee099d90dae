"""Stage 1, admission: a non-blocking permit per input, taken before any work is queued.

The permits bound every queue behind them: a request's are given back only once none of its work is
left in a queue. With several workers they are counted in one ledger, the server's.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Protocol

from app.engine.priority import DEFAULT_URGENCY, admission_limit
from app.errors import Overloaded


class Permits:
    """Permits held by one request, given back once it is done with them (``with``, :meth:`release`) AND
    every stage holding some of its work has let go (:meth:`keep`, :meth:`let_go`): a request whose client
    left keeps them while its texts wait to be tokenised, so no new request finds that queue full."""

    __slots__ = ("_holds", "_released", "_token", "admission", "count")

    def __init__(self, admission: Admission, count: int) -> None:
        self.admission = admission
        self.count = count
        self._holds = 1  # the request's own; a stage holding its work adds one (keep) until it lets go
        self._released = False
        self._token: Token[Permits | None] | None = None

    def keep(self) -> None:
        """A stage holds some of the request's work: the permits stay taken until it lets go."""
        with self.admission.lock:
            if self._holds == 0:
                raise RuntimeError("a stage kept permits already given back")
            self._holds += 1

    def let_go(self) -> None:
        """A holder is done (from any thread); the last one gives the permits back."""
        with self.admission.lock:
            self._holds -= 1
            last = self._holds == 0
        if last and self.admission.ledger.give_back(self.count) < 0:
            raise RuntimeError("admission released more permits than it gave out")

    def release(self) -> None:
        """The request is done with them (idempotent)."""
        with self.admission.lock:
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

    def try_take(self, count: int, limit: int) -> bool: ...  # add count if the total stays within limit
    def give_back(self, count: int) -> int: ...  # the total after
    def total(self) -> int: ...


class LocalLedger:
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
        """``ledger``: a :class:`LocalLedger` until a worker of several joins the server's (:meth:`join`);
        ``model``: whose budget this is, in a service of several (a 429 says whose)."""
        self.limit = limit
        self.model = model
        self.ledger: Ledger = ledger if ledger is not None else LocalLedger()
        self.rejected = 0  # requests refused
        # Guards each request's count of holders (Permits), changed on the loop and the stage threads.
        self.lock = threading.Lock()

    @property
    def in_use(self) -> int:
        return self.ledger.total()

    def try_acquire(self, count: int, urgency: int = DEFAULT_URGENCY) -> Permits:
        """Take ``count`` permits at once or raise :class:`~app.errors.Overloaded`."""
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
        """Count permits in ``ledger`` (the server's) from now on, once this worker is warm: the warm-up
        counts its own, so a replacement started while the server is full still warms up."""
        if self.ledger.total() != 0:
            raise RuntimeError(f"admission joined another ledger with {self.ledger.total()} permits held")
        self.ledger = ledger
