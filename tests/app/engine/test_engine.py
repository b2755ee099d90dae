"""The engine under load: no cross-talk, batches really form, cancelled or failed work is dropped."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import httpx
import numpy as np
import pytest

from app.engine.clock import Clock
from app.engine.engine import Engine
from app.engine.work import Job, Need, Seq
from app.errors import InternalError
from app.settings import Settings
from app.telemetry.metrics import Metrics
from tests.app.conftest import Running

CHARS = "北京天气很好我们去公园散步吧上海是中国的城市人民"


def random_request(rng: random.Random) -> dict[str, Any]:
    inputs = [
        "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 120))) for _ in range(rng.randint(1, 6))
    ]
    body: dict[str, Any] = {"inputs": inputs, "pooling": rng.choice(["cls", "mean", "pooler"])}
    if body["pooling"] != "pooler" and rng.random() < 0.5:
        body["layers"] = rng.sample([1, 2, 3], rng.randint(1, 3))
    return body


def test_200_concurrent_requests_equal_each_sent_alone(server: Running) -> None:
    rng = random.Random(3)
    bodies = [random_request(rng) for _ in range(200)]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        alone = [client.post("/embed", json=body).json() for body in bodies]
    before = server.service.engine.stats()

    async def together() -> list[Any]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            responses = await asyncio.gather(*(client.post("/embed", json=body) for body in bodies))
        assert all(r.status_code == 200 for r in responses), [
            r.text for r in responses if r.status_code != 200
        ]
        return [r.json() for r in responses]

    results = asyncio.run(together())
    after = server.service.engine.stats()
    for got, want in zip(results, alone, strict=True):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=2e-5)
    items = after["batched_items"] - before["batched_items"]
    batches = after["batches"] - before["batches"]
    # Identical inputs (same options) in flight together are computed once: between the distinct ones
    # and all of them, depending on timing.
    distinct = {
        (repr(sorted((k, str(v)) for k, v in b.items() if k != "inputs")), t)
        for b in bodies
        for t in b["inputs"]
    }
    assert len(distinct) <= items <= sum(len(b["inputs"]) for b in bodies)
    assert batches < items / 2  # many inputs shared a batch
    assert after["largest_batch"] > 1
    assert after["inputs_in_flight"] == 0


def job_of(lengths: list[int]) -> tuple[Job, list[Seq]]:
    job = Job(asyncio.get_running_loop(), len(lengths))
    need = Need(layers=(3,), pooling="cls")
    ids = [np.array([101] + [791] * (n - 2) + [102], dtype=np.int64) for n in lengths]
    enqueued = Clock().now()  # the clock of an engine not handed one: real time
    return job, [Seq(x, need, job, i, enqueued) for i, x in enumerate(ids)]


def test_cancelled_requests_are_dropped_before_inference(tiny_model: Any, tiny_settings: Settings) -> None:
    engine = Engine(tiny_model, tiny_settings, Metrics())
    # Everything but the inference thread (which assembles the batches) runs, so the cancelled request's
    # items are still queued when it leaves.
    engine.tokenization.start()

    async def main() -> None:
        gone, sequences = job_of([5, 9, 12])
        task = asyncio.ensure_future(engine.run(gone, sequences))
        await asyncio.sleep(0)  # the items are queued
        assert engine.batcher.depth == 3
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert gone.cancelled
        engine.scheduler.start()
        stays = await engine.run(*job_of([7]))
        assert stays.vectors is not None and stays.vectors.shape[0] == 1

    try:
        asyncio.run(main())
        assert engine.batcher.stats.dropped_cancelled == 3
        assert engine.inference.stats.items == 1
    finally:
        engine.stop()


def test_a_failed_batchs_job_has_its_other_sequences_dropped_unrun(
    tiny_model: Any, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch of a job fails: its other sequences, still queued, never run (no request awaits them,
    and no permits stand behind them)."""
    engine = Engine(
        tiny_model,
        tiny_settings.model_copy(update={"max_batch_size": 1, "measure_batch_cost": False}),
        Metrics(),
    )
    ran: list[int] = []  # rows of each batch the model ran
    original = tiny_model.encode

    def first_fails(input_ids: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        ran.append(len(input_ids))
        if len(ran) == 1:
            raise RuntimeError("out of memory")
        return original(input_ids, *args, **kwargs)

    monkeypatch.setattr(tiny_model, "encode", first_fails)

    async def main() -> None:
        with pytest.raises(InternalError, match="a batch of 1 failed"):
            await engine.run(*job_of([6, 6, 6]))  # one sequence a batch: the first batch fails
        while engine.batcher.depth:  # (at once: dropped before the request got its error)
            await asyncio.sleep(0.01)

    engine.start()
    try:
        asyncio.run(asyncio.wait_for(main(), 60))  # bounded: a queue that never drains fails, not hangs
    finally:
        engine.stop()  # joins the inference thread: a batch it had cut has run by now
    assert ran == [1]
    assert engine.batcher.stats.dropped_cancelled + engine.inference.stats.dropped_cancelled == 2
