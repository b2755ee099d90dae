"""What the tasks return: a value with the time each stage took (:class:`~app.telemetry.timings.Timings`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import numpy as np

from app.engine.work import Job
from app.telemetry.context import CURRENT_TIMINGS
from app.telemetry.timings import Timings, ms

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


@dataclass
class Answer(Generic[T]):
    """What an endpoint returns: its value and how long each stage took."""

    value: T
    timings: Timings = field(default_factory=Timings)


@dataclass
class TokenVectors:
    """One input's answer on /embed_all: its token vectors and, if asked for, the tokens and norms."""

    vectors: np.ndarray  # [tokens, width] float32
    tokens: list[dict[str, Any]] | None = None
    norms: np.ndarray | None = None


def timed(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, Answer[T]]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, Answer[T]]]:
    """An endpoint timed whole, its timings left in ``CURRENT_TIMINGS`` for the request's span and log."""

    @functools.wraps(method)
    async def timed(self: S, *args: P.args, **kwargs: P.kwargs) -> Answer[T]:
        started = time.perf_counter()
        answer = await method(self, *args, **kwargs)
        answer.timings.total_ms = ms(time.perf_counter() - started)
        CURRENT_TIMINGS.set(answer.timings)
        return answer

    return timed


@dataclass
class Spent:
    """A call's engine work (cache misses only), added up as it runs."""

    jobs: list[Job] = field(default_factory=list)
    tokenization_ms: float = 0.0

    def timings(self) -> Timings:
        return timings_of(self.jobs, self.tokenization_ms)


def timings_of(jobs: list[Job], tokenization_ms: float) -> Timings:
    """Queue time is the longest any sequence waited; inference time sums the batches the jobs used."""
    batches = {started: seconds for job in jobs for started, seconds in job.batches.items()}
    return Timings(
        queue_ms=ms(max((job.queued_s for job in jobs), default=0.0)),
        tokenization_ms=tokenization_ms,
        inference_ms=ms(sum(batches.values())),
        tokens=sum(job.tokens for job in jobs),
    )
