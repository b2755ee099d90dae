"""The engine: the stages wired together, started and stopped as one.

admission (per request, on the event loop) → tokenisation thread → batch queue → inference thread
(assembles a batch, runs it, post-processes it) → the awaiting request. Two threads besides the event
loop, and for /embed one wake-up of the loop per request (:meth:`Engine.run_texts`).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from tokenizers import Encoding

from app.engine.admission import Admission, Ledger, Permits
from app.engine.batching import Batcher
from app.engine.inference import Inference
from app.engine.tokenization import Tokenization
from app.engine.work import Job, Plan, Sequence
from app.errors import InternalError, ServiceError
from app.model.runtime import OnnxModel
from app.model.tokenizer import TextInputs
from app.settings import Settings
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing


class Engine:
    def __init__(
        self,
        model: OnnxModel,
        settings: Settings,
        metrics: Metrics,
        ledger: Ledger | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``ledger``: where admission counts permits, shared by the workers of one server (default: here);
        ``tracing``: where batch spans go (None: tracing off)."""
        self.model = model
        self.metrics = metrics
        self.admission = Admission(settings.max_concurrent_inputs, ledger)
        self.tokenization = Tokenization(model.tokenizer, capacity=settings.max_concurrent_inputs)
        # Each admitted input becomes at most this many windows (a token never spans less than a char).
        windows = math.ceil(settings.max_input_chars / max(model.tokenizer.max_length - 2, 1)) + 1
        self.batcher = Batcher(
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            capacity=settings.max_concurrent_inputs * windows,
            metrics=self.metrics,
            company_expected=lambda: self.tokenization.pending_texts > 0,
            overhead_tokens=settings.batch_overhead_tokens,
        )
        self.inference = Inference(model, self.batcher, self.metrics, tracing)

    def start(self) -> None:
        self.tokenization.start()
        self.inference.start()

    def stop(self) -> None:
        self.batcher.stop()
        self.inference.stop()
        self.tokenization.stop()

    def admit(self, inputs: int) -> Permits:
        """Take a permit per input or raise :class:`~app.errors.Overloaded`, before any work is queued."""
        return self.admission.try_acquire(inputs)

    async def tokenize(
        self, texts: TextInputs, add_special_tokens: bool = True, offsets: bool = True
    ) -> list[Encoding]:
        return await self.tokenization.encode(texts, add_special_tokens, offsets)

    async def run(self, job: Job, sequences: list[Sequence]) -> Job:
        """Queue ``job``'s ``sequences`` for batching and wait until all have run; the results are in
        the job.

        If the awaiting request is cancelled (its client left), the job is cancelled so that the
        assembler and the inference stage drop whatever of it has not run yet.
        """
        self.batcher.submit(sequences)
        return await self._wait(job)

    async def run_texts(self, texts: list[str], plan: Plan) -> Job:
        """Tokenise ``texts``, turn their encodings into sequences with ``plan`` and run them as one job;
        the job's results (and ``context``, what ``plan`` left) once all have run.

        ``plan`` runs on the tokenisation thread, which queues the sequences itself: the event loop is
        woken once, with the answer (or with the ServiceError ``plan`` raised, or a tokeniser fault).
        """
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
            if not work.ids:
                raise InternalError("a plan gave no sequences to run")
            job.context = work.context
            job.expect(len(work.ids))
            enqueued = time.perf_counter()
            self.batcher.submit(
                [Sequence(ids, work.need, job, i, enqueued) for i, ids in enumerate(work.ids)]
            )

        # A tokeniser fault reaches the request as it is: a logged 500, as on every other path.
        self.tokenization.then(texts, planned, job.fail, lambda: not job.cancelled)
        return await self._wait(job)

    async def _wait(self, job: Job) -> Job:
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancel()
            self.batcher.poke()
            raise

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
        }
