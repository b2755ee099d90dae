"""What flows between the stages: a request's :class:`Job` and its sequences (:class:`Seq`).

A job is resolved ONCE, when its last sequence has been post-processed: one wake-up of the event loop per
request, not per text. Both use ``__slots__`` and plain attributes: every text passes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding

from app.engine.pooling import Pooling
from app.engine.priority import URGENCY
from app.telemetry.context import CURRENT_SPAN


@dataclass(frozen=True)
class Need:
    """What one sequence needs from the encoder (``layers`` 1-based; ``pooling`` None: no pooled vectors).
    ``pool_from``: positions before it (a prompt sentence-transformers leaves out) are not pooled."""

    layers: tuple[int, ...] = ()
    pooling: Pooling | None = None
    tokens: bool = False
    mask_positions: tuple[int, ...] = ()
    pool_from: int = 0
    head: bool = False
    sparse: bool = False


@dataclass(frozen=True)
class Planned:
    """A request's encodings as planned on the tokenisation thread; ``context`` becomes ``Job.context``."""

    ids: list[np.ndarray]
    need: Need
    context: Any = None


# Encodings → sequences, run on the tokenisation thread; raises a ServiceError for input it refuses.
Plan = Callable[[list[Encoding]], Planned]


class Job:
    """One request's sequences in the engine, their results (written on the inference thread) and the
    future the request awaits: ``vectors`` [sequences, layers, hidden] (a head's logits, SPLADE vectors:
    [sequences, 1, n]); ``token_states`` per sequence [layers, length, hidden] (a tagger's: [1, length,
    labels]); ``mask_probs`` per sequence a [vocab] row per mask. Cancelled or failed, its sequences not
    yet run are dropped by every stage."""

    __slots__ = (
        "batches",
        "cancelled",
        "context",
        "count",
        "error",
        "future",
        "loop",
        "mask_probs",
        "queued_s",
        "remaining",
        "token_states",
        "tokenized_s",
        "tokens",
        "trace",
        "urgency",
        "vectors",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.loop = loop
        # Resolved with None, not the job: a future holding its own job would make every request a reference
        # cycle, which only the cyclic collector frees, and it runs rarely (docs/performance.md).
        self.future: asyncio.Future[None] = loop.create_future()
        # Why it failed, for the request to raise (``Engine``), not kept in the future: the exception's
        # traceback holds frames that hold this job, so a job holding it would be a cycle per failed request.
        self.error: BaseException | None = None
        self.count = count
        self.remaining = count
        self.cancelled = False  # a plain store: read by the stage threads, set by cancel or fail
        self.vectors: np.ndarray | None = None
        self.token_states: list[np.ndarray | None] = []
        self.mask_probs: list[np.ndarray | None] = []
        self.queued_s = 0.0
        self.batches: dict[float, float] = {}
        self.tokenized_s = 0.0
        self.context: Any = None
        self.tokens = 0  # tokens of its sequences that ran (post-processing adds them up)
        self.trace = CURRENT_SPAN.get()  # the request's span, for the batch spans to link to
        self.urgency = URGENCY.get()  # the request's, set by the API layer in this task

    def cancel(self) -> None:
        self.cancelled = True

    def finish(self, sequences: int) -> None:
        """``sequences`` more are done (only the inference thread changes ``remaining``); the last wakes."""
        self.remaining -= sequences
        if self.remaining == 0:
            self.loop.call_soon_threadsafe(_resolve, self)

    def fail(self, exc: BaseException) -> None:
        """Fail the request with ``exc`` (from any thread); marked cancelled at once, so the next batch does
        not run its sequences (the request pokes the batch queue once it wakes)."""
        self.cancelled = True
        self.loop.call_soon_threadsafe(_resolve, self, exc)

    def raise_error(self) -> None:
        """Raise what the job failed with, if it did, forgetting it first and dropping this frame's reference
        after: the traceback's frames hold the job, which must not lead back to them."""
        error, self.error = self.error, None
        if error is None:
            return
        try:
            raise error
        finally:
            del error


class Seq:
    """One input (or window of one); ``enqueued_at`` is read from the engine's clock (zero is a time too)."""

    __slots__ = ("enqueued_at", "ids", "job", "length", "need", "slot", "types")

    def __init__(
        self,
        ids: np.ndarray,
        need: Need,
        job: Job,
        slot: int,
        enqueued_at: float,
        types: np.ndarray | None = None,
    ) -> None:
        self.ids = ids  # int64 [length], [CLS] … [SEP]
        self.types = types  # token type ids [length] of a pair ([CLS] a [SEP] b [SEP]); None: all 0
        self.length = int(ids.shape[0])
        self.need = need
        self.job = job
        self.slot = slot  # its row in the job's results
        self.enqueued_at = enqueued_at


def _resolve(job: Job, exc: BaseException | None = None) -> None:
    if not job.future.done():
        job.error = exc
        job.future.set_result(None)
