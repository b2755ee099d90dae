"""A batch queue served as a service of one model serves its engine's: by a scheduler with one lane, whose
``next_batch`` the tests call as the inference thread would (:mod:`app.engine.scheduler`)."""

from __future__ import annotations

from typing import Any

from app.engine.batching import Batcher
from app.engine.clock import Clock
from app.engine.scheduler import Scheduler
from app.engine.work import Seq


class Unserved:
    """The lane's inference stage, which these tests never start: they take the batches themselves."""

    calibrate = None
    fault: str | None = None

    def serve(self, batch: list[Seq], trimmer: Any = None) -> None:
        raise AssertionError("a batch taken by hand is not served")


class OneLane(Batcher):
    """A :class:`Batcher` (same arguments) on its own one-lane :class:`Scheduler`'s condition and clock."""

    def __init__(self, *args: Any, clock: Clock | None = None, **kwargs: Any) -> None:
        self.scheduler = Scheduler(clock)
        kwargs.update(clock=self.scheduler.clock, cond=self.scheduler.cond)
        super().__init__(*args, **kwargs)
        self.scheduler.add("alone", self, Unserved())  # type: ignore[arg-type]

    def next_batch(self) -> list[Seq] | None:
        """The scheduler's next batch of this queue: block until one is due (None once stopped)."""
        picked = self.scheduler.next_batch()
        return None if picked is None else picked[1]

    def stop(self) -> None:
        self.scheduler.stop()
