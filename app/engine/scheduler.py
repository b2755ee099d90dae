"""The inference thread: when a batch is due, which model's runs next, and what the thread does if it dies.

Every engine's batches run on a scheduler's ONE inference thread (:meth:`Scheduler.next_batch`,
:meth:`Scheduler._run`): a service of one model is a scheduler with one lane, which its
:class:`~app.engine.engine.Engine` builds, starts and stops itself. A service of several models
(``ZHEMBED_MODELS``) has one engine per model (its own admission budget, tokeniser, batch queue and
measured cost model) and, per device, one scheduler that serves every queue, its sessions on ONNX
Runtime's one shared thread pool (:mod:`app.model.pool`, every physical core but one unless set): one
batch at a time, never a pool per model fighting the others for the same cores (but for the express
threads' short batches, below). Before each batch the thread asks every queue what it would run next
(:meth:`~app.engine.batching.Batcher.offer`: the queue's own plan, when it is due and what it holds) and
runs, of the offers (with one lane, that queue's, once due):

1. **the most urgent**: the lowest level after aging (the request's RFC 9218 urgency, aged so background
   work never starves), as within one queue;
2. of those, **an overdue one**: one holding an input past its queue-delay budget, the one furthest past
   its own model's budget, counted in budgets, first (such an input is never passed over again; under
   load every model's is, and oldest-first would serve the models in lock-step);
3. else **the most work per second**, by each model's own measured cost model: the highest share of the
   batch's modelled time that is useful work (:attr:`~app.engine.planner.Window.efficiency`; each model
   measures its own batches, so a tiny tagger's and a bert-base embedder's compare on equal terms); on a
   tie, the oldest input first.

When the most urgent offers are still waiting for company, the thread waits for the earliest of them (at
most ``max_wait_ms``; sooner if an arrival may make one due), and with nothing pending for any arrival; a
less urgent batch does not slip in meanwhile. And a less urgent batch is held to its budget while ANY
model has more urgent work about (the ``seen`` times handed to each offer), so a background client of the
embedder costs an interactive reranker at most one budget's wait.

**A cheap batch runs beside a long one.** One batch at a time makes a tagger's 1 ms batch wait out the
embedder's 40 ms one; a process per model would not (the OS would give the tagger a core at once). So
*express* threads, one per model but one, serve only while the inference thread runs a batch: each runs,
beside it, a due batch of another model that is at least as urgent and modelled to take at most
``express_share`` of the batch in progress (both by their own models' measured costs), chosen as above.
The cores are then shared only for such short batches; a model's queue hands out one batch at a time, so
no model runs on two threads at once (with one thread per model but one, no express thread waits for a
model while another model's batch is due). ``express_share`` 0: the inference thread only.

Every queue shares the scheduler's lock and condition and its :class:`~app.engine.clock.Clock`: an
arrival at any of them wakes the threads when it may change a decision. A thread's previous batch is done
when it asks for its next one; after every ``trim_every`` batches of the inference thread, the C heap is
trimmed (:mod:`app.model.allocator`).

A batch's fault fails that batch only (:meth:`~app.engine.inference.Inference.serve`). Should a thread die
anyway (a ``BaseException``), :func:`refuse_after` records why in every model's ``fault`` (the worker's
``/health`` turns 503 and it is replaced: :mod:`app.serving.server`) and answers the batch it held and
every one queued after it 503 (:class:`~app.errors.Unavailable`) until the scheduler stops, so no request
waits for ever.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

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
    """One model's queue and the stage that runs its batches; ``batches``: how many the threads ran (those
    of the express threads are counted in its queue's ``stats.beside`` too)."""

    name: str
    batcher: Batcher
    inference: Inference
    batches: int = field(default=0)


@dataclass(frozen=True)
class Running:
    """The batch a thread runs: its lane's index, its modelled seconds and its urgency level."""

    lane: int
    seconds: float
    level: int


def rank(offer: Offer) -> tuple[float, ...]:
    """How an offer ranks among those of the most urgent level (higher runs first): an overdue one before
    any other, the one furthest past its own model's budget first (in budgets: a tagger's input that has
    waited ten of its 2 ms budgets goes before an embedder's that has waited two of its 25 ms ones); else
    by efficiency, then the oldest input first."""
    if offer.overdue:
        return (1.0, (offer.now - offer.oldest.enqueued_at) / offer.budget_s)
    return (0.0, offer.window.efficiency, -offer.oldest.enqueued_at)


def _batch(picked: tuple[Lane, list[Seq]] | None) -> list[Seq] | None:
    return picked[1] if picked is not None else None


MAIN, EXPRESS = 0, 1  # the inference thread and the first express one, as keys of what each runs


class Scheduler:
    """One inference thread (and, for several models, express threads) over the queues of its lanes."""

    def __init__(self, clock: Clock | None = None, trim_every: int = 0, express_share: float = 0.0) -> None:
        """``clock``: what every queue reads the time from and waits through (default: real time);
        ``trim_every``: the inference thread's batches between two trims of the C heap (0: none);
        ``express_share``: the longest batch an express thread runs beside the inference thread's, as a
        share of that batch's modelled time (0: no express threads)."""
        self.cond = threading.Condition()
        self.clock = clock or Clock()
        self.lanes: list[Lane] = []
        self.trimmer = allocator.Trimmer(trim_every)
        self.express_share = express_share
        self._stopped = False
        self._running: dict[int, Running] = {}  # by thread (MAIN, then 1, 2, … express): what it runs
        self._waiting = 0  # threads waiting on the condition
        self._threads = [threading.Thread(target=self._run, name="zhembed-inference", daemon=True)]

    def add(self, name: str, batcher: Batcher, inference: Inference) -> None:
        """Serve ``batcher``'s batches with ``inference`` (before :meth:`start`); the queue must have been
        built on this scheduler's condition and clock."""
        if batcher._cond is not self.cond or batcher.clock is not self.clock:
            raise ValueError(f"the queue of {name} must share the scheduler's condition and clock")
        self.lanes.append(Lane(name, batcher, inference))

    @property
    def waiting(self) -> int:
        """How many of its threads wait for a batch to become due."""
        return self._waiting

    @property
    def express_threads(self) -> int:
        """How many express threads it started."""
        return len(self._threads) - 1

    def start(self) -> None:
        """Start the inference thread and, with an ``express_share``, an express thread per model but one
        (none for one model)."""
        if self.express_share > 0:
            for k in range(1, len(self.lanes)):
                self._threads.append(
                    threading.Thread(target=self._run_express, args=(k,), name="zhembed-express", daemon=True)
                )
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

    def _run(self) -> None:
        batch: list[Seq] = []
        try:
            for lane in self.lanes:  # each model's cost model, measured (or read) before any batch runs
                if lane.inference.calibrate is not None:
                    lane.inference.calibrate()
            while (picked := self.next_batch()) is not None:
                lane, batch = picked
                lane.inference.serve(batch, self.trimmer)  # a fault fails only the batch's requests
        except BaseException as exc:  # the thread is dying: every model says so and answers what waits
            refuse_after(
                exc, batch, [lane.inference for lane in self.lanes], lambda: _batch(self.next_batch())
            )

    def _run_express(self, k: int) -> None:
        batch: list[Seq] = []
        try:
            while (picked := self.next_express(k)) is not None:
                lane, batch = picked
                lane.inference.serve(batch)
        except BaseException as exc:  # its next_express frees the lane it ran, then refuses what it takes
            refuse_after(
                exc, batch, [lane.inference for lane in self.lanes], lambda: _batch(self.next_express(k))
            )

    def _seen(self) -> list[float] | None:
        """When work of each urgency last arrived at any queue (None: one queue, which reads its own)."""
        if len(self.lanes) == 1:
            return None
        return [max(times) for times in zip(*(lane.batcher.seen() for lane in self.lanes), strict=True)]

    def next_batch(self) -> tuple[Lane, list[Seq]] | None:
        """The inference thread's next batch and its lane: block until some queue's batch is due (None
        once stopped). Its previous batch is done."""
        with self.cond:
            self._done(MAIN)
            waited: set[int] = set()  # the lanes whose offer waited for company
            while True:
                if self._stopped:
                    return None
                now = self.clock.now()
                offers = self._offers(now)
                if offers is None:  # a cancelled request's sequences were dropped: plan again
                    continue
                if not offers:
                    self._wait(None)
                    continue
                level = min(offer.level for _, offer in offers)
                top = [(i, offer) for i, offer in offers if offer.level == level]
                due = [(i, offer) for i, offer in top if offer.due]
                if due:
                    pick = max(due, key=lambda pair: rank(pair[1]))
                    return self._take(MAIN, pick, pick[0] in waited)
                waited.update(i for i, _ in top)
                self._wait(min(offer.due_at for _, offer in top) - now)

    def next_express(self, k: int = EXPRESS) -> tuple[Lane, list[Seq]] | None:
        """Express thread ``k``'s next batch and its lane: block until, while the inference thread runs a
        batch, another model's due batch at least as urgent fits in ``express_share`` of that batch's
        modelled time and no other thread runs that model (None once stopped). Its previous batch is
        done."""
        with self.cond:
            self._done(k)
            while True:
                if self._stopped:
                    return None
                running = self._running.get(MAIN)
                if running is None:  # nothing to run beside: the inference thread takes what comes
                    self._wait(None)
                    continue
                now = self.clock.now()
                offers = self._offers(now)
                if offers is None:
                    continue
                limit = self.express_share * running.seconds  # inf while its model has no scale yet
                fits = [
                    (i, offer)
                    for i, offer in offers
                    if offer.level <= running.level and offer.seconds <= limit < math.inf
                ]
                due = [(i, offer) for i, offer in fits if offer.due]
                if due:
                    return self._take(k, max(due, key=lambda pair: rank(pair[1])), False)
                self._wait(min(offer.due_at for _, offer in fits) - now if fits else None)

    def _take(self, thread: int, pick: tuple[int, Offer], waited: bool) -> tuple[Lane, list[Seq]]:
        """Cut ``pick``'s batch for ``thread`` (the lock held), which runs its lane until it asks again."""
        i, offer = pick
        lane = self.lanes[i]
        lane.batches += 1
        lane.batcher.stats.beside += thread != MAIN
        self._running[thread] = Running(i, offer.seconds, offer.level)
        if thread == MAIN and self.express_share > 0:
            self.cond.notify_all()  # the express threads may now run something beside it
        return lane, lane.batcher.cut(offer, waited)

    def _done(self, thread: int) -> None:
        """``thread``'s batch has run (the lock held): its lane is free for either thread again."""
        if self._running.pop(thread, None) is not None and self.express_share > 0:
            self.cond.notify_all()

    def _offers(self, now: float) -> list[tuple[int, Offer]] | None:
        """What each queue with work pending and no batch running would run next (None: one dropped
        cancelled work; ask again)."""
        seen = self._seen()
        busy = {running.lane for running in self._running.values()}
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
        self._waiting += 1
        try:
            self.clock.wait(self.cond, timeout)
        finally:
            self._waiting -= 1
            if not self._waiting:
                for lane in self.lanes:
                    lane.batcher.listen(False)


def refuse_after(
    exc: BaseException, batch: list[Seq], stages: list[Inference], take: Callable[[], list[Seq] | None]
) -> None:
    """What an inference thread does once ``exc`` has ended its serving: record why in each of ``stages``
    (its models'; their /health turns 503), answer ``batch`` (the one it held) and each batch ``take``
    hands out after it with 503, until ``take`` returns None (the scheduler stops)."""
    reason = f"the inference thread stopped: {type(exc).__name__}"
    log.critical("%s; this worker answers 503 until it is replaced", reason, exc_info=exc)
    for stage in stages:
        stage.fault = reason
    error = Unavailable(f"{reason}; this worker is being replaced: retry")
    fail_jobs(batch, error)
    try:
        while (taken := take()) is not None:
            fail_jobs(taken, error)
    except BaseException:  # nothing is left to answer what is queued now: the replacement will
        log.critical("the inference thread could not go on refusing work", exc_info=True)
