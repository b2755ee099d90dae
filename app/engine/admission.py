"""Stage 1, admission: a non-blocking permit per input, taken before any work is queued.

The bound (``max_concurrent_inputs``) is also what bounds every queue behind it: nothing enters the
tokenisation or batch queues without permits, so they can never hold more than the bound's worth.
"""

from __future__ import annotations

import threading
from types import TracebackType

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


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_use = 0
        self._lock = threading.Lock()
        self.rejected = 0  # requests refused, for /info and tests

    @property
    def in_use(self) -> int:
        return self._in_use

    def try_acquire(self, count: int) -> Permits:
        """Take ``count`` permits at once or none.

        Raises:
            Overloaded: fewer than ``count`` permits are free.
        """
        if count < 1:
            raise ValueError(f"a request takes at least one permit, not {count}")
        with self._lock:
            if self._in_use + count > self.limit:
                self.rejected += 1
                raise Overloaded(
                    f"{self._in_use} of {self.limit} inputs in flight; {count} more do not fit, retry later"
                )
            self._in_use += count
        return Permits(self, count)

    def _give_back(self, count: int) -> None:
        with self._lock:
            self._in_use -= count
            if self._in_use < 0:
                raise RuntimeError("admission released more permits than it gave out")
