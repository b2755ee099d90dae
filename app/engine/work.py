"""What flows between the stages: a request's job and its sequences.

A :class:`Job` is one request's engine call: it is created on the event loop, carries the request's
results as arrays, and is resolved ONCE, when its last sequence has been post-processed (one thread-safe
wake-up of the event loop per request, not one per text). A job whose texts the engine tokenises itself
(:meth:`app.engine.engine.Engine.run_texts`) learns its sequence count on the tokenisation thread, from
its :data:`Plan`, which turns the encodings into :class:`Planned` token ids there: the request's texts go
from the loop to the batch queue without waking the loop in between. A :class:`Seq` is one input, or one
window of a long input; it knows its job and its row (``slot``) in the job's results. Both use
``__slots__`` and plain attributes: every text of every request passes through here, and what runs per
text is what a GPU waits on.
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
    """What one sequence needs from the encoder.

    ``layers`` are 1-based; ``pooling`` None means it wants no pooled vectors (fill-mask).
    ``pool_from``: token positions before it are left out of the pooling (a prompt that the model's
    sentence-transformers Pooling excludes: ``include_prompt`` false); pooled in numpy then.
    ``tokens`` means it wants the full rows of its real tokens in each of ``layers`` (/embed_all).
    ``mask_positions`` are token positions to run the masked-LM head on.
    ``head``: it wants the fine-tuned head's logits (per sequence, or per real token for a tagger).
    ``sparse``: it wants its SPLADE vector [vocab] (the sparse graph on its last hidden state).
    """

    layers: tuple[int, ...] = ()
    pooling: Pooling | None = None
    tokens: bool = False
    mask_positions: tuple[int, ...] = ()
    pool_from: int = 0
    head: bool = False
    sparse: bool = False


@dataclass(frozen=True)
class Planned:
    """What a request's encodings become on the tokenisation thread: the token ids of its sequences,
    what they need, and ``context`` for the request to read back on the loop (``Job.context``)."""

    ids: list[np.ndarray]
    need: Need
    context: Any = None


# Encodings → sequences, run on the tokenisation thread; raises a ServiceError for input it refuses.
Plan = Callable[[list[Encoding]], Planned]


class Job:
    """One request's sequences in the engine, their results, and the future the request awaits.

    Results (filled by post-processing on the inference thread, read by the request once the future is
    done):

    - ``vectors``: [sequences, len(layers), hidden] pooled vectors (pooler: one "layer"), a sequence
      head's logits [sequences, 1, labels], or SPLADE vectors [sequences, 1, vocab];
    - ``token_states``: per sequence [len(layers), length, hidden], every real token's state (/embed_all),
      or a tagger's logits [1, length, labels];
    - ``mask_probs``: per sequence one [vocab] probability row per mask position (fill-mask);
    - ``queued_s``: the longest any sequence waited for its batch; ``batches``: the inference seconds of
      each batch the job used, by the batch's start time;
    - ``tokenized_s``: seconds from the job's creation until its texts were encoded (``run_texts`` only);
      ``context``: what its :data:`Plan` left for the request;
    - ``urgency``: the request's (0 most urgent … 7 background), read from
      :data:`app.engine.priority.URGENCY` when the job is created, in the request's task.

    Cancelling (its client left) or failing (one of its batches did) makes every stage drop its
    sequences that have not run yet: none runs with no request waiting for it.
    """

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
        self.remaining = count  # changed by the inference thread only (post-processing)
        self.cancelled = False  # a plain store: read by the stage threads, set by cancel or fail
        self.vectors: np.ndarray | None = None
        self.token_states: list[np.ndarray | None] = []
        self.mask_probs: list[np.ndarray | None] = []
        self.queued_s = 0.0
        self.batches: dict[float, float] = {}
        self.tokenized_s = 0.0
        self.context: Any = None
        self.tokens = 0  # tokens of its sequences that ran (post-processing adds them up)
        # The request's trace span, for the batch spans to link to (None unless tracing is on).
        self.trace = CURRENT_SPAN.get()
        # The request's urgency (0 most urgent … 7 background), set by the API layer in this task.
        self.urgency = URGENCY.get()

    def expect(self, count: int) -> None:
        """Set the number of sequences, for a job created before its texts were tokenised (count 0);
        on the tokenisation thread, before any of them is queued."""
        self.count = self.remaining = count

    def cancel(self) -> None:
        self.cancelled = True

    def finish(self, sequences: int) -> None:
        """``sequences`` more of this job are done; wake the request when that was the last of them.

        Called on the inference thread; safe because only that thread changes ``remaining``.
        """
        self.remaining -= sequences
        if self.remaining == 0:
            self.loop.call_soon_threadsafe(_set_result, self.future)

    def fail(self, exc: BaseException) -> None:
        """Fail the request with ``exc`` (from any thread); later results are ignored, and its sequences
        not yet run are dropped (marked here, at once: the batch after this one must not run them; the
        request pokes the batch queue once it wakes, :meth:`app.engine.engine.Engine.run`)."""
        self.cancelled = True
        self.loop.call_soon_threadsafe(_set_error, self, exc)

    def raise_error(self) -> None:
        """Raise what the job failed with, if it did, and let go of it (once the future is done).

        The job forgets the exception before raising it, and this frame drops its own reference after:
        the frames on its traceback (the request's, the plan's) hold the job, and neither may lead back.
        """
        error, self.error = self.error, None
        if error is None:
            return
        try:
            raise error
        finally:
            del error


class Seq:
    """One sequence of token ids: an input (or one window of a long input) on its way through the engine.
    (Not ``Sequence``: that name is ``collections.abc``'s.)

    ``enqueued_at``: when it was queued, read from the engine's clock (:mod:`app.engine.clock`), which
    the batch queue compares it with; every value is a time, zero too (a simulated clock starts there).
    """

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


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_error(job: Job, exc: BaseException) -> None:
    if not job.future.done():
        job.error = exc
        job.future.set_result(None)
