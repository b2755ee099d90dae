"""The engine: one model's stages wired together, started and stopped as one.

admission → tokenisation thread → batch queue → inference thread (a
:class:`~app.engine.scheduler.Scheduler`'s: its own, or the one several models share) → the request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Any

from tokenizers import Encoding

from app.engine import calibration, costs
from app.engine.admission import HELD, Admission, Permits
from app.engine.batching import Batcher
from app.engine.inference import Inference
from app.engine.planner import Limits
from app.engine.priority import URGENCIES, URGENCY
from app.engine.scheduler import Scheduler
from app.engine.tokenization import Tokenization
from app.engine.work import Job, Plan, Seq
from app.errors import ServiceError
from app.model.runtime import CUDA, OnnxModel
from app.model.tokenizer import TextInputs
from app.settings import Settings
from app.telemetry.metrics import Metrics
from app.telemetry.timings import ms
from app.telemetry.tracing import Tracing

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        model: OnnxModel,
        settings: Settings,
        metrics: Metrics,
        tracing: Tracing | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        """``scheduler``: the one several models share (None: one of its own)."""
        self.model = model
        self.metrics = metrics
        self.settings = settings
        name = settings.served_model_name if scheduler is not None else None
        self._owns_scheduler = scheduler is None
        self.scheduler = scheduler or Scheduler(trim_every=settings.memory_trim_batches)
        self.admission = Admission(settings.max_concurrent_inputs, model=name)
        self.clock = self.scheduler.clock  # every time the engine compares is read from it
        self.tokenization = Tokenization(
            model.tokenizer,
            capacity=settings.max_concurrent_inputs,
            aging_ms=settings.urgency_aging_ms,
            clock=self.clock,
        )
        # Each admitted input becomes at most this many windows (a token never spans less than a char).
        windows = math.ceil(settings.max_input_chars / max(model.tokenizer.max_length - 2, 1)) + 1
        attention = settings.max_batch_attention  # on a CPU by default 8 inputs of 256 tokens, or 2 of 512
        if attention is None:
            attention = 0 if model.providers[0] == CUDA else 8 * 256 * 256
        self.batcher = Batcher(
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            max_batch_attention=attention,
            max_wait_ms=settings.max_wait_ms,
            capacity=settings.max_concurrent_inputs * windows,
            metrics=self.metrics,
            company_expected=lambda: self.tokenization.pending_texts > 0,
            costs=costs.CostModel.constant(settings.batch_overhead_tokens),
            max_queue_delay_ms=settings.max_queue_delay_ms,
            urgency_aging_ms=settings.urgency_aging_ms,
            background_share=settings.background_share,
            clock=self.clock,
            cond=self.scheduler.cond,
        )
        self.calibrated = threading.Event()  # set once the queue plans by the cost model it will keep
        self.inference = Inference(model, self.batcher, self.metrics, tracing, self._calibrate, name)
        self.scheduler.add(settings.served_model_name or "model", self.batcher, self.inference)

    @property
    def limits(self) -> Limits:
        return self.batcher.planner.limits

    def start(self) -> None:
        """Start the tokenisation thread, and the inference thread unless it is shared (its owner's)."""
        self.tokenization.start()
        if self._owns_scheduler:
            self.scheduler.start()

    def stop(self) -> None:
        if self._owns_scheduler:
            self.scheduler.stop()
        self.tokenization.stop()

    def _calibrate(self) -> None:
        """On the inference thread, before its first batch: each grid shape run once, then the cost model."""
        shapes, s = self.model.shapes, self.settings
        try:
            if shapes is not None:  # a failure here is the thread's: it goes on up
                shapes.warm(self.limits.room)
            model = self.batcher.costs  # measured here or read from the cache, else the constant
            try:
                if s.measure_batch_cost:
                    model = calibration.load_or_measure(
                        self.model,
                        calibration.session_runner(self.model),
                        max_size=s.max_batch_size,
                        max_tokens=s.max_batch_tokens,
                        max_attention=self.limits.attention,
                        intra_op_threads=self.model.threads,
                        cache_dir=s.cache_path,
                    )
            except Exception as exc:  # the constant stands in: batches still run, /info says why
                log.exception("measuring the batch cost failed; planning by batch_overhead_tokens")
                model = costs.CostModel.constant(
                    s.batch_overhead_tokens, f"measuring failed: {type(exc).__name__}"
                )
            self.batcher.set_costs(model.on_grid(shapes.grid) if shapes is not None else model)
        finally:  # /ready's wait ends either way
            self.calibrated.set()

    async def wait_calibrated(self) -> None:
        """Until the cost model is in place."""
        if not self.calibrated.is_set():
            await asyncio.to_thread(self.calibrated.wait)

    def admit(self, inputs: int) -> Permits:
        """Take a permit per input, at the task's urgency, or raise :class:`~app.errors.Overloaded`."""
        return self.admission.try_acquire(inputs, URGENCY.get())

    def held(self) -> Permits | None:
        """The permits this engine admitted the current request with (None outside its ``with`` block)."""
        permits = HELD.get()
        return permits if permits is not None and permits.admission is self.admission else None

    async def tokenize(
        self, texts: TextInputs, add_special_tokens: bool = True, offsets: bool = True
    ) -> tuple[list[Encoding], float]:
        """Encodings of ``texts`` and the milliseconds it took; ``offsets=False`` when no span is read."""
        started = time.perf_counter()
        encodings = await self.tokenization.encode(texts, add_special_tokens, offsets, self.held())
        self.metrics.tokenized(seconds := time.perf_counter() - started)
        return encodings, ms(seconds)

    async def run(self, job: Job, sequences: list[Seq]) -> Job:
        """Queue ``job``'s ``sequences`` and wait until all have run. Cancelled or failed, none of it is left
        in the batch queue when this returns, so the request's permits may go."""
        self.batcher.submit(sequences)
        return await self._wait(job)

    async def run_texts(self, texts: list[str], plan: Plan) -> Job:
        """Tokenise ``texts`` and run what ``plan`` makes of them as one job. ``plan`` runs on the
        tokenisation thread, which queues the sequences itself: the loop is woken once, with the answer."""
        job = Job(asyncio.get_running_loop(), 0)
        created = time.perf_counter()

        def planned(encodings: list[Encoding]) -> None:
            job.tokenized_s = time.perf_counter() - created
            self.metrics.tokenized(job.tokenized_s)
            try:
                work = plan(encodings)
            except ServiceError as exc:  # the request's own fault: its 4xx
                job.fail(exc)
                return
            job.context = work.context
            if not work.ids:  # every input refused (the caller keeps why): answered now
                job.finish(0)
                return
            job.count = job.remaining = len(work.ids)  # before any is queued
            enqueued = self.clock.now()
            self.batcher.submit([Seq(ids, work.need, job, i, enqueued) for i, ids in enumerate(work.ids)])

        # A tokeniser fault reaches the request as it is: a logged 500, as on every other path.
        self.tokenization.then(texts, planned, job.fail, lambda: not job.cancelled, self.held())
        return await self._wait(job)

    async def _wait(self, job: Job) -> Job:
        try:
            await job.future
        except asyncio.CancelledError:
            job.cancel()
            self.batcher.poke()
            raise
        if job.error is not None and job.remaining:  # failed with sequences out: drop what is queued
            self.batcher.poke()
        job.raise_error()
        return job

    def stats(self) -> dict[str, Any]:
        b, i = self.batcher.stats, self.inference.stats
        return {
            "inputs_in_flight": self.admission.in_use,
            "rejected_requests": self.admission.rejected,
            "queue_depth": self.batcher.depth,
            "batches": b.batches,
            "batched_items": b.items,
            "largest_batch": b.largest_batch,
            "real_tokens": b.real_tokens,
            "padded_tokens": b.padded_tokens,
            "batches_that_waited": b.waits,
            "dropped_cancelled": b.dropped_cancelled + i.dropped_cancelled,
            "inference_busy_s": round(i.busy_s, 3),
            "tokenizer_calls": self.tokenization.calls,
            "requests_tokenized_on_the_event_loop": self.tokenization.inline_calls,
            "batches_holding_an_overdue_input": b.overdue,
            "inputs_filled_into_more_urgent_batches": b.filled,
            "batches_capped_for_more_urgent_work": b.capped,
            "batches_of_aged_work": b.aged,
            "batches_for_the_background_floor": b.floor,
            "batches_beside_another_models": b.beside,
            "batched_by_urgency": {str(u): b.by_urgency[u] for u in URGENCIES if b.by_urgency[u]},
            "queue_depth_by_urgency": {str(u): d for u in URGENCIES if (d := self.batcher.depth_of(u))},
        }

    def scheduling(self) -> dict[str, Any]:
        """What /info shows of how batches are chosen."""
        budget = self.batcher.budget_s()
        return {
            "cost_model": self.batcher.costs.describe(),
            "queue_delay_budget_ms": round(budget * 1000, 3) if budget != float("inf") else None,
            "queue_delay_budget": "max_queue_delay_ms"
            if self.settings.max_queue_delay_ms is not None
            else "derived: half a full batch of the mean length seen, by the cost model",
            "urgency_aging_ms": self.settings.urgency_aging_ms,
            "background_share": self.settings.background_share,
        }
