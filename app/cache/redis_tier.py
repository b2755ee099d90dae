"""The shared tier: Redis, read with one MGET per request and written in the background.

A Redis fault never fails a request. Every call has short connect/read timeouts and no retries; a fault
is counted and opens a breaker that skips Redis for 0.1 s, doubling on each further fault up to
``redis_max_backoff_s``, so a dead Redis costs nothing per request. When the pause is over one request
probes (the others keep skipping) and a success closes the breaker: it reconnects on its own.

Writes never delay a response: they go into a bounded pending map that one writer task flushes in
pipelines of ``SET key value EX ttl``; when the map is full (Redis slower than the traffic) new writes
are dropped and counted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from app.cache.values import SIZE, misfit
from app.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

TIER = "redis"
# Connections per process: one MGET per request is sub-millisecond on a LAN, so a few dozen serve
# thousands of requests per second; past it a request waits at most the timeout, then skips Redis.
_CONNECTIONS = 32
# Vectors waiting to be written: ~3 kB each at 768 floats, so at most ~12 MB.
_MAX_PENDING = 4096
# SETs per pipeline: a few hundred kB per round trip, well inside one read timeout.
_WRITE_CHUNK = 256
_FIRST_BACKOFF_S = 0.1


class Breaker:
    """Skips a failing dependency for a growing pause; one caller probes when the pause is over."""

    def __init__(self, max_backoff_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._backoff = 0.0  # 0 = closed (healthy)
        self._until = 0.0

    @property
    def closed(self) -> bool:
        return self._backoff == 0.0

    def allows(self) -> bool:
        if self.closed:
            return True
        now = self._clock()
        if now < self._until:
            return False
        self._until = now + self._backoff  # this caller probes; the others skip until it reports
        return True

    def failed(self) -> float:
        """Record a fault; returns the pause now in force."""
        self._backoff = min(max(self._backoff * 2, _FIRST_BACKOFF_S), self.max_backoff_s)
        self._until = self._clock() + self._backoff
        return self._backoff

    def succeeded(self) -> None:
        self._backoff = 0.0
        self._until = 0.0


class RedisTier:
    def __init__(
        self, url: str, ttl_s: int, timeout_s: float, max_backoff_s: float, metrics: Metrics
    ) -> None:
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=_CONNECTIONS,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the breaker decides when to try again, not the client
        )
        self._client = Redis(connection_pool=pool)
        self._pool = pool
        self.ttl_s = ttl_s
        self.metrics = metrics
        self.breaker = Breaker(max_backoff_s)
        self._pending: dict[str, bytes | None] = {}  # None: delete the key
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the writer task on the running loop."""
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="zhembed-redis-writer")

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self._client.aclose()
        await self._pool.disconnect()

    async def get_many(
        self, keys: list[str], metrics: Metrics | None = None, width: int | None = None
    ) -> dict[str, bytes]:
        """The values Redis holds for ``keys``, in one round trip; {} while Redis is failing. Hits and
        misses are counted in ``metrics`` (the asking model's view, with several; default: this tier's).

        A value that is not ``width`` float32 numbers (None: any number of them) is no hit: it is
        deleted, counted in ``zhembed_cache_rejected_total``, and the caller computes it again.
        """
        metrics = metrics or self.metrics
        if not keys or not self.breaker.allows():
            return {}
        try:
            values = await self._client.mget(keys)
        except (RedisError, OSError) as exc:  # OSError includes the builtin TimeoutError
            self._fault("read", exc)
            return {}
        self.breaker.succeeded()
        found: dict[str, bytes] = {}
        rejected: dict[str, str] = {}
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            if not isinstance(value, bytes):  # redis-py decodes nothing here: not bytes is not ours
                rejected[key] = SIZE
            elif (why := misfit(value, width)) is not None:
                rejected[key] = why
            else:
                found[key] = value
        if rejected:
            self.discard(list(rejected))
            for why, count in collections.Counter(rejected.values()).items():
                metrics.cache_rejected(TIER, why, count)
        metrics.cache_lookup(TIER, hits=len(found), misses=len(keys) - len(found))
        return found

    def discard(self, keys: list[str]) -> None:
        """Queue ``keys`` for deletion (values that do not fit their key); returns at once. A value
        written for one of them later in the same flush wins: deletion is its pending value, None."""
        self.put_many(dict.fromkeys(keys))

    def put_many(self, items: Mapping[str, bytes | None]) -> None:
        """Queue ``items`` for writing (None: deleting); returns at once."""
        if not items or self._wake is None or not self.breaker.closed:
            return  # while Redis is failing, writes would only be dropped later
        room = _MAX_PENDING - len(self._pending)
        if room < len(items):
            self.metrics.cache_error(TIER, len(items) - max(room, 0))
        for key, value in list(items.items())[: max(room, 0)]:
            self._pending[key] = value
        self._wake.set()

    async def _write_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending = self._pending, {}
                if not self.breaker.allows():
                    break
                await self._write(batch)

    async def _write(self, batch: dict[str, bytes | None]) -> None:
        items = list(batch.items())
        try:
            for start in range(0, len(items), _WRITE_CHUNK):
                async with self._client.pipeline(transaction=False) as pipe:
                    for key, value in items[start : start + _WRITE_CHUNK]:
                        if value is None:
                            pipe.delete(key)
                        else:
                            pipe.set(key, value, ex=self.ttl_s)
                    await pipe.execute()
        except (RedisError, OSError) as exc:
            self._fault("write", exc)
            return
        self.breaker.succeeded()

    def _fault(self, what: str, exc: BaseException) -> None:
        was_closed = self.breaker.closed
        pause = self.breaker.failed()
        self.metrics.cache_error(TIER)
        # Never the URL: it may hold a password.
        log.log(
            logging.WARNING if was_closed else logging.DEBUG,
            "redis cache %s failed (%s: %s); skipping redis for %.1f s",
            what,
            type(exc).__name__,
            exc,
            pause,
        )

    def stats(self) -> dict[str, object]:
        return {"healthy": self.breaker.closed, "pending_writes": len(self._pending)}
