"""What flows between the stages: a request's ticket, its work items and their results."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from app.engine.pooling import Pooling


class Ticket:
    """One request's shared state; cancelling it makes every stage drop the request's items."""

    def __init__(self) -> None:
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass(frozen=True)
class Need:
    """What one item needs from the encoder.

    ``layers`` are 1-based; ``pooling`` None means the item wants no pooled vectors (fill-mask).
    ``tokens`` means it wants the full rows of its real tokens in each of ``layers`` (/embed_all).
    ``mask_positions`` are token positions to run the masked-LM head on.
    """

    layers: tuple[int, ...] = ()
    pooling: Pooling | None = None
    tokens: bool = False
    mask_positions: tuple[int, ...] = ()


@dataclass
class ItemResult:
    # [len(layers), hidden] pooled vectors, one row per requested layer (pooler: one row).
    vectors: np.ndarray | None
    # one [vocab] float32 probability row per mask position.
    mask_probs: np.ndarray | None
    queued_s: float
    inference_s: float
    batch_started: float  # identifies the batch: a request's items may share one or span several
    batch_size: int
    # [len(layers), length, hidden]: every real token's state in each requested layer (Need.tokens);
    # a copy, so it neither holds the batch's outputs alive nor carries any padding row.
    token_states: np.ndarray | None = None


@dataclass
class WorkItem:
    """One sequence (an input, or one window of a long input) on its way through the engine."""

    ids: np.ndarray  # int64 [length], [CLS] … [SEP]
    need: Need
    ticket: Ticket
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[ItemResult]
    enqueued_at: float = field(default_factory=time.perf_counter)

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    def resolve(self, result: ItemResult) -> None:
        """Hand ``result`` to the awaiting coroutine; safe from any thread."""
        self.loop.call_soon_threadsafe(_set_result, self.future, result)

    def fail(self, exc: BaseException) -> None:
        self.loop.call_soon_threadsafe(_set_exception, self.future, exc)


def _set_result(future: asyncio.Future[ItemResult], result: ItemResult) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[ItemResult], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
