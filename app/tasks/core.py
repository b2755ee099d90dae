"""The core every task stands on: the model, engine and cache, and the steps each task takes the
same way (readiness, the per-request limits, tokenising, one job to the engine, the routes this model
serves). :meth:`Core.cached` is the one way a task's outputs go through the vector cache."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from app.cache import keys as cache_keys
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.work import Job, Need, Seq
from app.errors import NotReady, Unsupported
from app.model.manifest import KIND_NAMES, MANIFEST_NAME, Head, Kind
from app.model.runtime import OnnxModel
from app.settings import Settings
from app.tasks.options import Direction, EmbedOptions, LongText, Names, model_defaults
from app.tasks.prepare import Rules, texts_of

R = TypeVar("R")  # what a task computes for distinct inputs, in their order
A = TypeVar("A")  # what it answers for a request's inputs, in input order


@dataclass(frozen=True)
class Packing(Generic[R, A]):
    """How a task's outputs are kept in the vector cache and answered (:meth:`Core.cached`)."""

    space: Callable[[], str]  # the key space (:func:`app.cache.keys.space`): asked only with a cache
    width: int | None  # float32 numbers of each entry; None: any number (app.cache.vectors)
    pack: Callable[[R], list[np.ndarray] | np.ndarray]  # computed → one float32 entry per input
    unpack: Callable[[list[np.ndarray]], A]  # each input's entry → the answer
    take: Callable[[R, list[int] | None], A]  # computed → the answer: those rows (None: all, in order)


def taken(rows: np.ndarray, at: list[int] | None) -> np.ndarray:
    return rows if at is None else rows[at]


# The distinct keys to compute and the input each one is first seen at (by its place among them): its
# name in an error message.
Compute = Callable[[list[str], Callable[[int], int]], Awaitable[R]]

# The routes each kind of model serves beside the embedding routes, which every kind serves (a fine-tuned
# head's encoder computes vectors too).
HEAD_ROUTES: dict[str, tuple[str, ...]] = {
    "embedding": (),
    "classifier": ("/predict",),
    "reranker": ("/predict", "/rerank", "/v1/rerank", "/v2/rerank"),
    "tagger": ("/token-classification",),
}
EMBEDDING_ROUTES = (
    "/",
    "/embed",
    "/embed_all",
    "/similarity",
    "/v1/embeddings",
    "/v2/embed",
    "/v1/embed",
    "/tokenize",
    "/decode",
)


class Core:
    """What every task shares: one per process, built once the model is loaded."""

    def __init__(self, settings: Settings, model: OnnxModel, engine: Engine, cache: VectorCache) -> None:
        self.settings = settings
        self.model = model
        self.engine = engine
        self.cache = cache
        self.ready = False
        m = model.manifest
        self.served_name = settings.served_model_name or m.source.name()
        # OpenAI's model card has a creation time: when this export was written.
        self.created = int((model.folder / MANIFEST_NAME).stat().st_mtime)
        # Every graph and tokenizer setting of the variant served: part of every cache key.
        self.model_digest = cache_keys.model_digest(m, model.variant)
        self.kind: Kind = m.kind
        # What a request gets for the options it leaves out: the model's own, or a plain BERT's.
        self.defaults: EmbedOptions = model_defaults(m.defaults)

    def routes(self) -> list[str]:
        return [
            *EMBEDDING_ROUTES,
            *(("/fill-mask",) if self.model.has_mlm_head else ()),
            *(("/embed_sparse",) if self.model.has_sparse else ()),
            *HEAD_ROUTES[self.kind],
        ]

    def head(self, route: str, *kinds: str) -> Head:
        """The model's head, if it is of one of ``kinds``; else Unsupported (NotReady while warming up)."""
        self.check_ready()
        head = self.model.manifest.head
        if self.kind not in kinds or head is None or not self.model.has_head:
            wanted = " or ".join(KIND_NAMES[k] for k in kinds)
            raise Unsupported(
                f"{route} needs {wanted}; this model ({self.served_name}) is {KIND_NAMES[self.kind]}, "
                f"which serves {', '.join(self.routes())}"
            )
        return head

    def check_ready(self) -> None:
        if not self.ready:
            raise NotReady("the model is still warming up")

    def texts(self, inputs: str | list[str], names: Names) -> list[str]:
        """The request's texts as a list, checked against the per-request limits."""
        return texts_of(inputs, self.settings.max_inputs_per_request, self.settings.max_input_chars, names)

    def rules(
        self,
        too_long: str,
        long_text: LongText = "error",
        direction: Direction = "right",
        refuse_empty: bool = True,
    ) -> Rules:
        info = self.model.manifest.tokenizer
        limit = self.model.tokenizer.max_length
        return Rules(limit, too_long, long_text, direction, (info.cls_id, info.sep_id), refuse_empty)

    def key_space(self, **options: object) -> str:
        """The cache's key space of this model's outputs made with ``options`` (the other fields None)."""
        return cache_keys.space(self.model_digest, {**dict.fromkeys(cache_keys.OPTION_FIELDS), **options})

    async def cached(self, keys: list[str], compute: Compute[R], packing: Packing[R, A]) -> A:
        """The answer for each of ``keys`` (equal keys, equal outputs), through the cache when there is one.
        Permits are held for every input, cached or not: they bound the cache's in-flight map too."""
        first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))  # key → its first input

        async def run(todo: list[str]) -> R:
            return await compute(todo, lambda k: first[todo[k]])

        async def packed(todo: list[str]) -> list[np.ndarray] | np.ndarray:
            return packing.pack(await run(todo))

        with self.engine.admit(len(keys)):
            if self.cache.enabled:
                return packing.unpack(await self.cache.vectors(packing.space(), keys, packed, packing.width))
            if len(first) == len(keys):
                return packing.take(await run(keys), None)
            distinct = list(dict.fromkeys(keys))
            row = {k: i for i, k in enumerate(distinct)}
            return packing.take(await run(distinct), [row[k] for k in keys])

    async def run(
        self,
        sequences: list[np.ndarray],
        need: Need | list[Need],
        type_ids: list[np.ndarray | None] | None = None,
    ) -> Job:
        """Run ``sequences`` (with token types for pairs) as one job, each with ``need`` (or its own)."""
        job = Job(asyncio.get_running_loop(), len(sequences))
        needs = need if isinstance(need, list) else [need] * len(sequences)
        types = type_ids if type_ids is not None else [None] * len(sequences)
        enqueued = self.engine.clock.now()  # the clock the batch queue compares it with
        work = [
            Seq(ids, n, job, i, enqueued, t)
            for i, (ids, n, t) in enumerate(zip(sequences, needs, types, strict=True))
        ]
        return await self.engine.run(job, work)


class Task:
    def __init__(self, core: Core) -> None:
        self.core = core
