"""The inference thread: which queue's batch runs next, and what the thread does if it dies.

One scheduler serves one model's queue, or every model's of a service of several, one batch at a time;
express threads run another model's short batch beside a long one (docs/architecture.md).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from app.engine.batching import Batcher
from app.engine.clock import Clock
from app.engine.inference import Inference, fail_jobs
from app.engine.pending import Offer
from app.engine.work import Seq
from app.errors import Unavailable
from app.model import allocator

log = logging.getLogger(__name__)


@dataclass
class Lane:
    """One model's queue and the stage that runs its batches."""

    name: str
    batcher: Batcher
    inference: Inference
    batches: int = 0


def rank(offer: Offer) -> tuple[float, ...]:
    """Higher runs first: an overdue offer, furthest past its own model's budget counted in budgets (oldest
    first served the models in lock-step); else by efficiency, then the oldest input."""
    if offer.overdue:
        return (1.0, (offer.now - offer.oldest.enqueued_at) / offer.budget_s)
    return (0.0, offer.window.efficiency, -offer.oldest.enqueued_at)


MAIN = 0  # the inference thread, as the key of what it runs (the express threads: 1, 2, …)


class Scheduler:
    """One inference thread (and, for several models, express threads) over the queues of its lanes."""

    def __init__(self, clock: Clock | None = None, trim_every: int = 0, express_share: float = 0.0) -> None:
        """``trim_every``: the inference thread's batches between two trims of the C heap (0: none);
        ``express_share``: an express thread's longest batch, as a share of the running one's (0: none)."""
        self.cond = threading.Condition()
        self.clock = clock or Clock()
        self.lanes: list[Lane] = []
        self.trimmer = allocator.Trimmer(trim_every)
        self.express_share = express_share
        self._stopped = False
        self._running: dict[int, tuple[int, Offer]] = {}  # by thread (MAIN, 1, 2, …): its lane and offer
        self.waiting = 0  # threads waiting on the condition
        self._threads: list[threading.Thread] = []

    @property
    def express_threads(self) -> int:  # started
        return max(len(self._threads) - 1, 0)

    def add(self, name: str, batcher: Batcher, inference: Inference) -> None:
        if batcher._cond is not self.cond or batcher.clock is not self.clock:
            raise ValueError(f"the queue of {name} must share the scheduler's condition and clock")
        self.lanes.append(Lane(name, batcher, inference))

    def start(self) -> None:
        express = len(self.lanes) - 1 if self.express_share > 0 else 0
        names = ["zhembed-inference"] + ["zhembed-express"] * express
        self._threads = [
            threading.Thread(target=self._run, args=(k,), name=n, daemon=True) for k, n in enumerate(names)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Let every thread go (each next batch is None) and join those started."""
        with self.cond:
            self._stopped = True
            self.cond.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=30)

    def _run(self, k: int) -> None:
        batch: list[Seq] = []
        trimmer = self.trimmer if k == MAIN else None
        try:
            for lane in self.lanes if k == MAIN else ():  # each cost model, before any batch runs
                if lane.inference.calibrate is not None:
                    lane.inference.calibrate()
            while (picked := self.next_batch(k)) is not None:
                lane, batch = picked
                lane.inference.serve(batch, trimmer)  # a fault fails only the batch's requests
        except BaseException as exc:  # the thread is dying: every model says so and answers what waits
            self._refuse(exc, batch, k)

    def next_batch(self, k: int = MAIN) -> tuple[Lane, list[Seq]] | None:
        """Thread ``k``'s next batch and its lane, once one is due (None once stopped); its previous batch is
        done. An express thread takes only what fits beside the inference thread's batch."""
        with self.cond:
            if self._running.pop(k, None) is not None and self.express_share > 0:
                self.cond.notify_all()  # its lane is free for either thread again
            waited: set[int] = set()  # the lanes whose offer waited for company
            while not self._stopped:
                running = self._running.get(MAIN)
                if k != MAIN and running is None:  # nothing to run beside: the inference thread takes it
                    self._wait(None)
                    continue
                now = self.clock.now()
                offers = self._offers(now)
                if offers is None:  # a cancelled request's sequences were dropped: plan again
                    continue
                if running is None:
                    level = min((offer.level for _, offer in offers), default=0)
                    top = [(i, offer) for i, offer in offers if offer.level == level]
                else:
                    limit = self.express_share * running[1].seconds  # inf while it has no scale yet
                    top = [
                        (i, offer)
                        for i, offer in offers
                        if offer.level <= running[1].level and offer.seconds <= limit < math.inf
                    ]
                due = [(i, offer) for i, offer in top if offer.due]
                if due:
                    i, offer = max(due, key=lambda pair: rank(pair[1]))
                    lane = self.lanes[i]
                    lane.batches += 1
                    lane.batcher.stats.beside += k != MAIN
                    self._running[k] = (i, offer)
                    if k == MAIN and self.express_share > 0:
                        self.cond.notify_all()  # the express threads may now run something beside it
                    return lane, lane.batcher.cut(offer, k == MAIN and i in waited)
                waited.update(i for i, _ in top)
                self._wait(min(offer.due_at for _, offer in top) - now if top else None)
            return None

    def _offers(self, now: float) -> list[tuple[int, Offer]] | None:
        """Each idle queue's offer (None: one dropped cancelled work; ask again)."""
        seen = None  # one queue reads its own; of several, when work of each urgency last arrived at any
        if len(self.lanes) > 1:
            seen = [max(times) for times in zip(*(lane.batcher.seen() for lane in self.lanes), strict=True)]
        busy = {i for i, _ in self._running.values()}
        offers = []
        for i, lane in enumerate(self.lanes):
            if lane.batcher.depth and i not in busy:
                offer = lane.batcher.offer(now, seen)
                if offer is None:
                    return None
                offers.append((i, offer))
        return offers

    def _wait(self, timeout: float | None) -> None:
        """Wait (the lock held) for an arrival that may change the decision, or ``timeout`` seconds; the
        queues stop waking anyone once no thread waits."""
        for lane in self.lanes:
            lane.batcher.listen(True)
        self.waiting += 1
        try:
            self.clock.wait(self.cond, timeout)
        finally:
            self.waiting -= 1
            if not self.waiting:
                for lane in self.lanes:
                    lane.batcher.listen(False)

    def _refuse(self, exc: BaseException, batch: list[Seq], k: int) -> None:
        """Once ``exc`` has ended thread ``k``'s serving: every model's ``fault`` says why (their /health
        turns 503), and ``batch`` and each batch the thread takes after it are answered 503 until stopped."""
        reason = f"the inference thread stopped: {type(exc).__name__}"
        log.critical("%s; this worker answers 503 until it is replaced", reason, exc_info=exc)
        for lane in self.lanes:
            lane.inference.fault = reason
        error = Unavailable(f"{reason}; this worker is being replaced: retry")
        fail_jobs(batch, error)
        try:
            while (taken := self.next_batch(k)) is not None:
                fail_jobs(taken[1], error)
        except BaseException:  # nothing is left to answer what is queued now: the replacement will
            log.critical("the inference thread could not go on refusing work", exc_info=True)
