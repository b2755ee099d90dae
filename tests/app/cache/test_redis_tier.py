"""The Redis tier: the breaker, round trips against a real redis-server, and a Redis that dies, never
starts, or comes back: every request still succeeds, faults are counted, the cache returns on its own."""

from __future__ import annotations

import asyncio
import base64
from typing import cast

import httpx
import numpy as np
import pytest
import redis

from app.cache.redis_tier import Breaker, RedisTier
from app.settings import Settings
from app.telemetry.metrics import Metrics
from loadtest.server import RedisServer, free_port
from tests.app.conftest import metric, serving, wait_until, with_cache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_backs_off_doubling_and_lets_one_probe_through() -> None:
    clock = Clock()
    breaker = Breaker(max_backoff_s=0.3, clock=clock)
    assert breaker.allows()
    assert breaker.failed() == 0.1 and not breaker.allows()
    clock.now += 0.1
    assert breaker.allows()  # the probe
    assert not breaker.allows()  # everyone else waits for it
    assert breaker.failed() == 0.2
    clock.now += 0.2
    assert breaker.allows() and breaker.failed() == 0.3  # capped
    clock.now += 0.3
    assert breaker.allows()
    breaker.succeeded()
    assert breaker.closed and breaker.allows() and breaker.allows()


def tier(url: str, metrics: Metrics) -> RedisTier:
    # A generous timeout: a loaded test machine must not turn a call into a fault (with_cache's reason).
    return RedisTier(url, ttl_s=60, timeout_s=10.0, max_backoff_s=1.0, metrics=metrics)


def test_one_mget_per_lookup_and_writes_with_a_ttl(own_redis: RedisServer) -> None:
    metrics = Metrics()
    value = np.arange(4, dtype="<f4").tobytes()

    async def scenario() -> tuple[dict[str, bytes], dict[str, bytes]]:
        shared = tier(own_redis.url, metrics)
        shared.start()
        try:
            before = await shared.get_many(["zhembed:v1:k1", "zhembed:v1:k2"])
            shared.put_many({"zhembed:v1:k1": value})
            for _ in range(6000):  # until the background write has landed (at most 60 s)
                await asyncio.sleep(0.01)
                if not shared.stats()["pending_writes"]:
                    break
            after = await shared.get_many(["zhembed:v1:k1", "zhembed:v1:k2"])
        finally:
            await shared.aclose()
        return before, after

    before, after = asyncio.run(scenario())
    assert before == {} and after == {"zhembed:v1:k1": value}
    assert 0 < own_redis.client().ttl("zhembed:v1:k1") <= 60
    commands = own_redis.client().info("commandstats")
    assert commands["cmdstat_mget"]["calls"] == 2
    assert metrics.cache_hits.labels("redis")._value.get() == 1
    assert metrics.cache_misses.labels("redis")._value.get() == 3


def test_a_redis_that_is_not_there_costs_one_fast_fault_then_nothing() -> None:
    metrics = Metrics()

    async def scenario() -> None:
        shared = tier(f"redis://127.0.0.1:{free_port()}/0", metrics)
        shared.start()
        try:
            for _ in range(20):
                assert await shared.get_many(["zhembed:v1:k"]) == {}
        finally:
            await shared.aclose()

    asyncio.run(scenario())
    assert metrics.cache_errors.labels("redis")._value.get() == 1  # the breaker skipped the other 19


# --- through a real server --------------------------------------------------------------------------


def embed_ok(client: httpx.Client, texts: list[str]) -> None:
    response = client.post("/embed", json={"inputs": texts})
    assert response.status_code == 200, response.text


def test_redis_stopped_mid_test_then_back(tiny_settings: Settings, own_redis: RedisServer) -> None:
    # No in-process tier, so every lookup reaches Redis; a short breaker so the test is quick.
    settings = with_cache(tiny_settings, own_redis.url, cache_bytes=0, redis_max_backoff_s=0.2)
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        embed_ok(client, ["重启之前"])
        wait_until(lambda: own_redis.client().dbsize() == 1, seconds=60)  # the background write landed
        embed_ok(client, ["重启之前"])
        assert metric(client, "zhembed_cache_hits_total", tier="redis") == 1

        own_redis.stop()
        for i in range(10):
            embed_ok(client, ["重启之前", f"Redis 停了 {i}"])
        errors = metric(client, "zhembed_cache_errors_total", tier="redis")
        assert 1 <= errors <= 10
        assert metric(client, "zhembed_failures_total", reason="internal") == 0

        own_redis.start()  # empty again: --save ''
        embed_ok(client, ["重启之后"])

        def used_again() -> bool:
            embed_ok(client, ["重启之后"])
            return metric(client, "zhembed_cache_hits_total", tier="redis") > 1

        wait_until(used_again, seconds=60)
        assert (
            metric(
                client, "zhembed_requests_total", route="/embed", status="200", protocol="http", urgency="3"
            )
            >= 14
        )


def test_redis_never_started(tiny_settings: Settings) -> None:
    settings = with_cache(tiny_settings, f"redis://127.0.0.1:{free_port()}/0", redis_max_backoff_s=0.2)
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        for i in range(5):
            embed_ok(client, [f"从来没有 Redis {i}", "重复的"])
        assert metric(client, "zhembed_cache_errors_total", tier="redis") >= 1
        assert metric(client, "zhembed_cache_hits_total", tier="memory") == 4  # "重复的", after the first
        assert (
            metric(
                client, "zhembed_requests_total", route="/embed", status="200", protocol="http", urgency="3"
            )
            == 5
        )


def test_a_stalled_redis_times_out_and_the_request_goes_on(
    tiny_settings: Settings, own_redis: RedisServer
) -> None:
    settings = with_cache(tiny_settings, own_redis.url, cache_bytes=0, redis_timeout_ms=50.0)
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        embed_ok(client, ["Redis 还活着"])  # a pooled connection exists
        # Its background write landed first: one still on its way when Redis stops would time out too.
        wait_until(lambda: own_redis.client().dbsize() == 1, seconds=10)
        # Redis answers nobody for 120 s: a deadline far past any machine's request, not a race with it
        # (a paused Redis still exits at once on the fixture's SIGTERM).
        own_redis.client().execute_command("CLIENT", "PAUSE", "120000", "ALL")
        embed_ok(client, ["Redis 卡住了"])
        assert metric(client, "zhembed_cache_errors_total", tier="redis") == 1
        # The request was answered while Redis still answered nobody: it went on after its own timeout.
        probe = redis.Redis.from_url(own_redis.url, socket_timeout=0.2)
        with pytest.raises(redis.exceptions.TimeoutError):
            probe.ping()


def vectors_of(client: httpx.Client, texts: list[str]) -> np.ndarray:
    response = client.post("/embed", json={"inputs": texts, "encoding": "base64"})
    assert response.status_code == 200, response.text
    return np.stack([np.frombuffer(base64.b64decode(v), dtype="<f4") for v in response.json()])


@pytest.mark.parametrize(("cut", "reason"), [(4, "width"), (1, "size")])
def test_a_value_that_does_not_fit_its_key_is_dropped_counted_and_computed_again(
    tiny_settings: Settings, own_redis: RedisServer, cut: int, reason: str
) -> None:
    # No in-process tier: the value Redis holds is the one read.
    settings = with_cache(tiny_settings, own_redis.url, cache_bytes=0)
    store = own_redis.client()
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        (first,) = vectors_of(client, ["宽度不对的值"])
        wait_until(lambda: store.dbsize() == 1, seconds=60)  # the background write landed
        (key,) = store.keys("zhembed:v1:*")
        right = cast(bytes, store.get(key))
        store.set(key, right[:-cut])  # one float32 short (another width), or not whole float32s
        # Beside a text of the right width, as a client's batch would have it: the two must stack.
        got = vectors_of(client, ["宽度不对的值", "另一个句子"])
        np.testing.assert_allclose(got[0], first, rtol=0, atol=1e-6)
        assert metric(client, "zhembed_cache_rejected_total", tier="redis", reason=reason) == 1
        assert metric(client, "zhembed_cache_hits_total", tier="redis") == 0
        # Deleted, then written again from the new computation: the next request hits it.
        wait_until(lambda: len(cast(bytes, store.get(key) or b"")) == len(right), seconds=60)
        vectors_of(client, ["宽度不对的值"])
        assert metric(client, "zhembed_cache_hits_total", tier="redis") == 1
        assert metric(client, "zhembed_failures_total", reason="internal") == 0
