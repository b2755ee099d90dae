"""Overload: past ``max_concurrent_inputs`` the service answers 429 with Retry-After at once (rejections
never wait in the queue), the accepted requests succeed, the metrics move, and in-flight returns to zero.

Inference is held on a gate so that "the accepted requests are still running" is a fact of the test, not
a matter of timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from app.api.errors import RETRY_AFTER_S
from app.settings import Settings
from loadtest import timeouts
from tests.app.conftest import Running, gate_inference, metric, serving, total, wait_until

LIMIT = 8


@pytest.fixture()
def small(tiny_settings: Settings) -> Iterator[Running]:
    settings = tiny_settings.model_copy(
        update={"max_concurrent_inputs": LIMIT, "max_inputs_per_request": 4, "warmup": False}
    )
    with serving(settings) as running:
        yield running


def test_past_the_bound_429_comes_at_once_and_accepted_requests_succeed(
    small: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gate_inference(monkeypatch, small)
    admission = small.service.engine.admission
    with httpx.Client(base_url=small.url, timeout=120) as client, ThreadPoolExecutor(16) as pool:
        accepted: list[Future[httpx.Response]] = [
            pool.submit(client.post, "/embed", json={"inputs": [f"先到 {i}", f"先到 {i} 第二句"]})
            for i in range(LIMIT // 2)
        ]
        wait_until(lambda: admission.in_use == LIMIT)  # every permit is held, inference is gated
        assert metric(client, "zhembed_inputs_in_flight") == LIMIT

        # These are answered while every accepted request is still blocked: nothing waited in a queue.
        rejected = [
            pool.submit(client.post, "/embed", json={"inputs": [f"后到 {i}"]}).result(timeout=60)
            for i in range(12)
        ]
        assert not gate.is_set() and not any(f.done() for f in accepted)
        for response in rejected:
            assert response.status_code == 429, response.text
            assert response.headers["retry-after"] == str(RETRY_AFTER_S)
            body = response.json()
            assert body["error_type"] == "overloaded"
            assert f"{LIMIT} of {LIMIT} inputs in flight" in body["error"]
        assert metric(client, "zhembed_failures_total", reason="overloaded") == 12
        assert (
            metric(
                client, "zhembed_requests_total", route="/embed", status="429", protocol="http", urgency="3"
            )
            == 12
        )

        gate.set()
        for future in accepted:
            response = future.result(timeout=120)
            assert response.status_code == 200, response.text
            assert len(response.json()) == 2

        wait_until(lambda: metric(client, "zhembed_inputs_in_flight") == 0)
        assert total(client, "zhembed_queue_depth") == 0
        # Back to normal as soon as the load is gone.
        assert client.post("/embed", json={"inputs": ["之后"]}).status_code == 200


def test_a_request_larger_than_the_free_permits_is_refused_whole(
    small: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gate_inference(monkeypatch, small)
    admission = small.service.engine.admission
    with httpx.Client(base_url=small.url, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        held = [pool.submit(client.post, "/embed", json={"inputs": ["甲", "乙", "丙"]}) for _ in range(2)]
        wait_until(lambda: admission.in_use == 6)
        too_many = client.post("/embed", json={"inputs": ["一", "二", "三"]})  # 3 > the 2 left
        assert too_many.status_code == 429
        assert admission.in_use == 6  # none of its permits were kept
        gate.set()
        assert [f.result(timeout=120).status_code for f in held] == [200, 200]
    assert admission.in_use == 0


def test_many_clients_past_capacity_get_only_200_or_429_and_nothing_leaks(small: Running) -> None:
    def client_loop(index: int) -> Counter[int]:
        seen: Counter[int] = Counter()
        with httpx.Client(base_url=small.url, timeout=120) as client:
            for j in range(15):
                texts = [f"客户 {index} 请求 {j} 句 {k}" for k in range(1 + (index + j) % 4)]
                response = client.post("/embed", json={"inputs": texts})
                seen[response.status_code] += 1
                if response.status_code == 200:
                    assert len(response.json()) == len(texts)
        return seen

    with ThreadPoolExecutor(24) as pool:
        totals = sum(
            (f.result(timeout=300) for f in [pool.submit(client_loop, i) for i in range(24)]), Counter()
        )
    assert set(totals) <= {200, 429}, totals
    assert totals[200] > 0
    with httpx.Client(base_url=small.url, timeout=60) as client:
        wait_until(lambda: metric(client, "zhembed_inputs_in_flight") == 0)
        assert metric(client, "zhembed_failures_total", reason="overloaded") == totals[429]
        assert total(client, "zhembed_queue_depth") == 0


def gate_tokenizer(monkeypatch: pytest.MonkeyPatch, running: Running) -> threading.Event:
    """Make every call of the tokenisation thread wait for the returned event before it encodes."""
    tokenizer = running.service.engine.tokenization.tokenizer
    original = tokenizer.encode_batch
    gate = threading.Event()

    def gated(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(timeout=120), "the test never opened the gate"
        return original(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode_batch", gated)
    return gate


def test_clients_that_leave_keep_their_permits_while_their_texts_are_queued(
    small: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their permits given back at once, new requests were admitted into a tokenisation queue still full
    of the gone requests' texts, and the next one found it full: a 500 where a 429 was promised."""
    gate = gate_tokenizer(monkeypatch, small)
    admission = small.service.engine.admission
    answered: list[int] = []

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=small.url, timeout=120) as c:
            leaving = [
                asyncio.create_task(c.post("/embed", json={"inputs": [f"走了 {i}"]})) for i in range(LIMIT)
            ]
            while admission.in_use < LIMIT:  # every permit held, every text queued or being encoded
                await asyncio.sleep(0.01)
            for task in leaving:
                task.cancel()
            await asyncio.gather(*leaving, return_exceptions=True)
            with httpx.Client(base_url=small.url, timeout=60) as sync:
                gone = {"route": "/embed", "status": "499", "protocol": "http", "urgency": "3"}
                while metric(sync, "zhembed_requests_total", **gone) < LIMIT:  # the server saw them go
                    await asyncio.sleep(0.01)
            after = [
                asyncio.create_task(c.post("/embed", json={"inputs": [f"后来 {i}"]})) for i in range(LIMIT)
            ]
            while not all(t.done() for t in after) and not any(
                t.done() and t.result().status_code == 500 for t in after
            ):
                await asyncio.sleep(0.01)
            gate.set()
            answered.extend(r.status_code for r in await asyncio.gather(*after))

    asyncio.run(asyncio.wait_for(scenario(), 120))  # bounded: a permit never given back fails, not hangs
    assert answered == [429] * LIMIT
    wait_until(lambda: admission.in_use == 0)  # given back once the thread dropped the gone requests' texts
    with httpx.Client(base_url=small.url, timeout=60) as client:
        assert client.post("/embed", json={"inputs": ["之后"]}).status_code == 200
        assert total(client, "zhembed_queue_depth") == 0


def test_clients_that_time_out_against_a_saturated_worker_get_no_500(
    tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50's run, smaller (``python -m loadtest.timeouts`` is the 512-client one): clients with a 1 s
    timeout against a worker held shut until they give up and then 3 s more (or three waves of give-ups,
    which only a worker that gives permits back too early admits), then let go; each sends one text (a
    queue entry per permit), and again at once after a timeout. Only 200, 429 and 503 come back, and the
    worker is healthy after with nothing left."""
    settings = tiny_settings.model_copy(
        update={"max_concurrent_inputs": 16, "max_inputs_per_request": 4, "warmup": False}
    )
    with serving(settings) as running:
        seen, state = timeouts.run(
            running.url, running.service, clients=128, timeout_s=1.0, hold_s=3.0, tail_s=0.5, big_every=0
        )
    assert seen[timeouts.TIMEOUT] > 0 and seen["200"] > 0 and seen["429"] > 0, seen  # it happened
    assert set(seen) <= timeouts.ALLOWED | {timeouts.TIMEOUT}, seen
    assert timeouts.broken(seen, state) == []
