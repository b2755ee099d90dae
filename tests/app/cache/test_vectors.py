"""The read-through flow: dedupe, single-flight, exact vectors; and, through real servers sharing a real
Redis, hits that equal the computed vectors, no collisions across options or models, replicas sharing."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import cast

import httpx
import numpy as np
import pytest

from app.cache.keys import key as cache_key
from app.cache.memory_tier import MemoryLRU
from app.cache.vectors import VectorCache
from app.errors import ValidationFailed
from app.settings import Settings
from app.telemetry.metrics import Metrics
from loadtest.server import RedisServer
from tests.app.conftest import Running, metric, serving, with_cache


class FakeCompute:
    """Counts what it is asked for; 'bad' texts fail like an over-long input would."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[list[str]] = []
        self.delay = delay

    async def __call__(self, texts: list[str]) -> list[np.ndarray]:
        self.calls.append(texts)
        await asyncio.sleep(self.delay)
        if "bad" in texts:
            raise ValidationFailed("bad input")
        return [np.full(4, float(len(t)), dtype=np.float32) + np.float32(0.1) for t in texts]


def test_identical_inputs_in_a_request_are_computed_once_and_exact() -> None:
    cache = VectorCache(MemoryLRU(1 << 20), None, Metrics())
    compute = FakeCompute()
    got = asyncio.run(cache.vectors("p:", ["a", "bb", "a"], compute))
    assert compute.calls == [["a", "bb"]]
    assert [v.tolist() for v in got] == [[np.float32(1.1)] * 4, [np.float32(2.1)] * 4, [np.float32(1.1)] * 4]
    again = asyncio.run(cache.vectors("p:", ["bb"], compute))
    assert len(compute.calls) == 1 and np.array_equal(again[0], got[1])


class BatchDependentCompute:
    """Like the engine's mean-pooled vectors: each text's last bits depend on the company it is batched
    with (here on the call's first text), as docs/api.md says they may."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, texts: list[str]) -> list[np.ndarray]:
        self.calls += 1
        bits = np.float32(1 + 1e-7 * len(texts[0]))
        return [np.full(4, np.float32(len(t)) * bits, dtype=np.float32) for t in texts]


def test_the_cache_serves_the_first_answer_thereafter() -> None:
    cache = VectorCache(MemoryLRU(1 << 20), None, Metrics())
    compute = BatchDependentCompute()
    first = asyncio.run(cache.vectors("p:", ["一个更长的同伴", "同一句话"], compute))[1]
    recomputed = asyncio.run(compute(["同一句话"]))[0]  # alone, as a request without the cache would be
    assert recomputed.tobytes() != first.tobytes()  # so the next assertion can tell the two apart
    for company in (["同一句话"], ["同一句话", "另一句"], ["很长很长很长的另一句话", "同一句话"]):
        got = asyncio.run(cache.vectors("p:", company, compute))[company.index("同一句话")]
        assert got.tobytes() == first.tobytes(), company


def test_concurrent_requests_for_the_same_input_compute_it_once() -> None:
    cache = VectorCache(None, None, Metrics())  # no tiers at all: single-flight still holds
    compute = FakeCompute(delay=0.05)

    async def together() -> list[list[np.ndarray]]:
        return await asyncio.gather(*(cache.vectors("p:", ["same", f"own{i}"], compute) for i in range(5)))

    results = asyncio.run(together())
    asked = [t for call in compute.calls for t in call]
    assert asked.count("same") == 1
    assert all(np.array_equal(r[0], results[0][0]) for r in results)
    assert cache.in_flight == 0


def test_a_waiter_whose_owner_failed_computes_for_itself() -> None:
    cache = VectorCache(None, None, Metrics())
    compute = FakeCompute(delay=0.05)

    async def together() -> list[object]:
        return await asyncio.gather(
            cache.vectors("p:", ["x", "bad"], compute),
            cache.vectors("p:", ["x"], compute),
            return_exceptions=True,
        )

    first, second = asyncio.run(together())
    assert isinstance(first, ValidationFailed)
    assert isinstance(second, list) and second[0][0] == np.float32(1.1)
    assert cache.in_flight == 0


def test_a_memory_value_of_another_width_is_dropped_counted_and_computed_again() -> None:
    metrics = Metrics()
    memory = MemoryLRU(1 << 20)
    cache = VectorCache(memory, None, metrics)
    key = cache_key("p:", "abc")
    memory.put(key, np.zeros(3, "<f4").tobytes())  # 3 numbers under a key whose output has 4
    compute = FakeCompute()
    (got,) = asyncio.run(cache.vectors("p:", ["abc"], compute, width=4))
    assert compute.calls == [["abc"]] and got.tolist() == [np.float32(3.1)] * 4
    assert metrics.cache_rejections.labels("memory", "width")._value.get() == 1
    assert memory.get(key) == got.tobytes()  # replaced by the computed vector


# --- through real servers sharing one Redis ----------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(tiny_settings: Settings, redis_server: RedisServer) -> Iterator[tuple[Running, Running]]:
    """Two replicas of the fp32 model sharing Redis (each with its own in-process tier)."""
    settings = with_cache(tiny_settings, redis_server.url)
    with serving(settings) as a, serving(settings) as b:
        yield a, b


def embed(client: httpx.Client, inputs: list[str], **options: object) -> list[np.ndarray]:
    response = client.post("/embed", json={"inputs": inputs, "encoding": "base64", **options})
    assert response.status_code == 200, response.text
    return [np.frombuffer(base64.b64decode(v), dtype="<f4") for v in response.json()]


def test_a_hit_returns_exactly_the_computed_vector(replicas: tuple[Running, Running]) -> None:
    a, b = replicas
    texts = ["命中测试一", "命中测试二，稍微长一点的句子。"]
    with httpx.Client(base_url=a.url) as ca, httpx.Client(base_url=b.url) as cb:
        computed = embed(ca, texts)
        items = a.service.engine.stats()["batched_items"]
        memory_hit = embed(ca, texts)
        assert a.service.engine.stats()["batched_items"] == items  # nothing recomputed
        redis_hits = metric(cb, "zhembed_cache_hits_total", tier="redis")
        redis_hit = embed(cb, texts)  # the other replica: from Redis
        assert metric(cb, "zhembed_cache_hits_total", tier="redis") == redis_hits + 2
        assert b.service.engine.stats()["batched_items"] == 0
        floats = ca.post("/embed", json={"inputs": texts}).json()
    for c, m, r, f in zip(computed, memory_hit, redis_hit, floats, strict=True):
        assert c.tobytes() == m.tobytes() == r.tobytes()
        assert np.asarray(f, dtype=np.float32).tobytes() == c.tobytes()


def test_different_options_never_collide(
    replicas: tuple[Running, Running], redis_server: RedisServer
) -> None:
    a, _ = replicas
    text = ["选项不同的同一句话"]
    option_sets: list[dict[str, object]] = [
        {},
        {"pooling": "cls"},
        {"pooling": "pooler"},
        {"layers": [1]},
        {"layers": [1, 2], "layer_combine": "mean"},
        {"layers": [1, 2]},
        {"normalize": False},
    ]
    with httpx.Client(base_url=a.url) as client:
        cold = [embed(client, text, **o)[0] for o in option_sets]
        warm = [embed(client, text, **o)[0] for o in option_sets]
    for i, vector in enumerate(cold):
        assert warm[i].tobytes() == vector.tobytes()
        for other in cold[i + 1 :]:
            assert vector.shape != other.shape or not np.allclose(vector, other)
    keys = cast(list[bytes], redis_server.client().keys("*"))  # bytes: the client does not decode
    assert all(key.startswith(b"zhembed:v1:") for key in keys)


def test_another_model_never_reads_this_ones_vectors(
    tiny_settings: Settings, replicas: tuple[Running, Running], redis_server: RedisServer
) -> None:
    a, _ = replicas
    text = ["换了模型就不能共用缓存"]
    with httpx.Client(base_url=a.url) as client:
        fp32 = embed(client, text)[0]
    settings = with_cache(tiny_settings, redis_server.url, variant="int8")
    with serving(settings) as int8, httpx.Client(base_url=int8.url) as client:
        got = embed(client, text)[0]
        assert metric(client, "zhembed_cache_hits_total", tier="redis") == 0
        assert metric(client, "zhembed_cache_misses_total", tier="redis") == 1
        assert int8.service.engine.stats()["batched_items"] == 1
    assert got.tobytes() != fp32.tobytes()
    assert a.service.model_digest != int8.service.model_digest


def test_errors_name_the_input_in_the_request_not_in_the_misses(replicas: tuple[Running, Running]) -> None:
    a, _ = replicas
    with httpx.Client(base_url=a.url) as client:
        embed(client, ["已缓存的短句"])
        response = client.post("/embed", json={"inputs": ["已缓存的短句", "长" * 300]})
    assert response.status_code == 422
    assert response.json()["error"].startswith("inputs[1] has 302 tokens")
