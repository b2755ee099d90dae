"""What flows between the stages: a request's :class:`Job` and its sequences (:class:`Seq`).

A job is resolved ONCE, when its last sequence has been post-processed: one wake-up of the event loop per
request, not per text. Both are slotted dataclasses: every text passes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
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


@dataclass(eq=False, repr=False, slots=True)
class Job:
    """One request's sequences in the engine, their results (written on the inference thread) and the
    future the request awaits: ``vectors`` [sequences, layers, hidden] (a head's logits, SPLADE vectors:
    [sequences, 1, n]); ``token_states`` per sequence [layers, length, hidden] (a tagger's: [1, length,
    labels]); ``mask_probs`` per sequence a [vocab] row per mask. Cancelled or failed, its sequences not
    yet run are dropped by every stage."""

    loop: asyncio.AbstractEventLoop
    count: int
    remaining: int = field(init=False)
    # Resolved with None, not the job: a future holding its own job would make every request a reference
    # cycle, which only the cyclic collector frees, and it runs rarely (docs/performance.md).
    future: asyncio.Future[None] = field(init=False)
    # Why it failed, for the request to raise (``Engine``), not kept in the future: the exception's
    # traceback holds frames that hold this job, so a job holding it would be a cycle per failed request.
    error: BaseException | None = None
    cancelled: bool = False  # a plain store: read by the stage threads, set by cancel or fail
    vectors: np.ndarray | None = None
    token_states: list[np.ndarray | None] = field(default_factory=list)
    mask_probs: list[np.ndarray | None] = field(default_factory=list)
    queued_s: float = 0.0
    batches: dict[float, float] = field(default_factory=dict)
    tokenized_s: float = 0.0
    context: Any = None
    tokens: int = 0  # tokens of its sequences that ran (post-processing adds them up)
    trace: Any = field(default_factory=CURRENT_SPAN.get)  # the request's span, for the batch spans to link to
    urgency: int = field(default_factory=URGENCY.get)  # the request's, set by the API layer in this task

    def __post_init__(self) -> None:
        self.remaining = self.count
        self.future = self.loop.create_future()

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


@dataclass(eq=False, repr=False, slots=True)
class Seq:
    """One input (or window of one); ``enqueued_at`` is read from the engine's clock (zero is a time too)."""

    ids: np.ndarray  # int64 [length], [CLS] … [SEP]
    need: Need
    job: Job
    slot: int  # its row in the job's results
    enqueued_at: float
    types: np.ndarray | None = None  # token type ids [length] of a pair ([CLS] a [SEP] b [SEP]); None: all 0
    length: int = field(init=False)

    def __post_init__(self) -> None:
        self.length = int(self.ids.shape[0])


def _resolve(job: Job, exc: BaseException | None = None) -> None:
    if not job.future.done():
        job.error = exc
        job.future.set_result(None)
