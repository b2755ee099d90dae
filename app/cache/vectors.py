"""The read-through flow over both tiers, with single-flight.

For one request's inputs: dedupe them, look in the in-process LRU, join any computation of the same key
already in flight (another request's), ask Redis for the rest in one round trip, compute what is still
missing in one engine call, then store it in both tiers (Redis in the background). Values are the raw
little-endian float32 bytes of the final vector (:mod:`app.cache.values`); the response encoding is
applied after the cache. A value of another width than the caller's is dropped from its tier, counted
(``zhembed_cache_rejected_total``) and computed again.

The in-flight map holds one future per key some request is computing; its owner holds admission permits
for that input, so the map is bounded by ``max_concurrent_inputs``. A waiter gets the bytes, or None if
the owner failed or was cancelled, and then computes the input itself (getting its own error, if any).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from app.cache.keys import key as cache_key
from app.cache.memory_tier import MemoryLRU
from app.cache.values import DTYPE, misfit
from app.telemetry.metrics import Metrics

if TYPE_CHECKING:  # redis-py is imported only when Redis is configured (6 MB resident)
    from app.cache.redis_tier import RedisTier

# Distinct texts → their vectors, in order (a list of vectors or the rows of one array).
Compute = Callable[[list[str]], Awaitable[list[np.ndarray] | np.ndarray]]

MEMORY = "memory"


class VectorCache:
    def __init__(self, memory: MemoryLRU | None, shared: RedisTier | None, metrics: Metrics) -> None:
        """One model's view of the tiers (several models share one LRU and one Redis: their keys differ
        by the model's digest); its lookups are counted in ``metrics``, that model's view."""
        self.memory = memory
        self.shared = shared
        self.metrics = metrics
        self._flights: dict[str, asyncio.Future[bytes | None]] = {}

    @property
    def enabled(self) -> bool:
        """Whether any tier is configured. Without one the service skips the cache altogether: no keys
        hashed, no in-flight futures, nothing per text; repeats within a request are still
        computed once, and concurrent requests of the same text each compute it."""
        return self.memory is not None or self.shared is not None

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def vectors(
        self, prefix: str, texts: list[str], compute: Compute, width: int | None = None
    ) -> list[np.ndarray]:
        """The vector of each of ``texts`` (keys under ``prefix``), from a tier or from ``compute``.

        ``compute`` gets distinct texts and returns their vectors in order; its errors propagate.
        ``width``: the float32 numbers of each vector (None: any number, for outputs of varying length);
        a tier's value of another width is dropped from it, counted, and computed again.
        """
        keys = [cache_key(prefix, text) for text in texts]
        text_of = dict(zip(keys, texts, strict=True))  # distinct keys, in first-seen order
        found = self._from_memory(list(text_of), width)
        missing = [k for k in text_of if k not in found]
        theirs = {k: f for k in missing if (f := self._flights.get(k)) is not None}
        mine = [k for k in missing if k not in theirs]
        if mine:
            loop = asyncio.get_running_loop()
            for k in mine:
                self._flights[k] = loop.create_future()
            try:
                await self._fill(mine, text_of, found, compute, width)
            finally:
                for k in mine:
                    future = self._flights.pop(k)
                    if not future.done():
                        future.set_result(found.get(k))
        for k, future in theirs.items():
            # shield: a waiter whose client leaves must not cancel the owner's future for the others.
            value = await asyncio.shield(future)
            if value is not None:
                found[k] = value
        orphans = [k for k in theirs if k not in found]
        if orphans:
            await self._fill(orphans, text_of, found, compute, width, shared=False)
        return [np.frombuffer(found[k], dtype=DTYPE) for k in keys]

    def _from_memory(self, keys: list[str], width: int | None) -> dict[str, bytes]:
        if self.memory is None:
            return {}
        found = {k: v for k in keys if (v := self.memory.get(k)) is not None}
        # Only what this process computed or took from Redis (checked) is here, so a misfit means two
        # outputs of different widths under one key: dropped like Redis's, not served. Checked in one
        # pass in C; value by value only when one does not fit.
        if width is None or set(map(len, found.values())) <= {width * DTYPE.itemsize}:
            return self._counted(found, len(keys))
        rejected = {k: why for k, v in found.items() if (why := misfit(v, width)) is not None}
        for k, why in rejected.items():
            del found[k]
            self.memory.discard(k)
            self.metrics.cache_rejected(MEMORY, why, 1)
        return self._counted(found, len(keys))

    def _counted(self, found: dict[str, bytes], asked: int) -> dict[str, bytes]:
        self.metrics.cache_lookup(MEMORY, hits=len(found), misses=asked - len(found))
        return found

    async def _fill(
        self,
        wanted: list[str],
        text_of: dict[str, str],
        found: dict[str, bytes],
        compute: Compute,
        width: int | None,
        shared: bool = True,
    ) -> None:
        todo = wanted
        if shared and self.shared is not None:
            got = await self.shared.get_many(todo, self.metrics, width)
            found.update(got)
            self._remember(got)
            todo = [k for k in todo if k not in got]
        if not todo:
            return
        vectors = await compute([text_of[k] for k in todo])
        fresh = {k: np.asarray(v, dtype=DTYPE).tobytes() for k, v in zip(todo, vectors, strict=True)}
        found.update(fresh)
        self._remember(fresh)
        if self.shared is not None:
            self.shared.put_many(fresh)

    def _remember(self, items: dict[str, bytes]) -> None:
        if self.memory is not None:
            for k, v in items.items():
                self.memory.put(k, v)

    def stats(self) -> dict[str, object]:
        return {
            "memory_entries": len(self.memory) if self.memory is not None else None,
            "memory_bytes": self.memory.bytes if self.memory is not None else None,
            "redis": self.shared.stats() if self.shared is not None else None,
            "in_flight_keys": self.in_flight,
        }
