"""What the workers of one server share: one admission budget across processes, readiness of all, the
worker count."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

import pytest

from app.engine.admission import Admission
from app.errors import Overloaded
from app.serving.cluster import AUTO_CUDA_WORKERS, Cluster, Shared, SharedLedger, resolve_count
from app.settings import Settings


def _hold(permits: Any, index: int, count: int, held: Any, release: Any) -> None:
    """In another process: take ``count`` permits as worker ``index``, hold them until told."""
    admission = Admission(10, SharedLedger(permits, index))
    with admission.try_acquire(count):
        held.set()
        release.wait(30)


def test_the_permit_budget_is_the_servers_not_each_workers() -> None:
    ctx = mp.get_context("spawn")
    permits = ctx.Array("q", 2)
    held, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(permits, 1, 7, held, release))
    other.start()
    try:
        assert held.wait(60)
        mine = Admission(10, SharedLedger(permits, 0))
        assert mine.in_use == 7
        with pytest.raises(Overloaded, match="7 of 10 inputs in flight"):
            mine.try_acquire(4)
        # One budget for every urgency: background work (u=7, half of it) is refused first, server-wide.
        with pytest.raises(Overloaded, match="of which requests of urgency 7 may fill 5"):
            mine.try_acquire(1, urgency=7)
        with mine.try_acquire(3):
            assert mine.in_use == 10
        release.set()
        other.join(30)
        assert mine.in_use == 0 and list(permits[:]) == [0, 0]
    finally:
        release.set()
        other.join(30)


def test_permits_a_stage_keeps_count_server_wide_until_its_thread_lets_go() -> None:
    """A request whose texts are still queued keeps its permits in the server's ledger after it is over;
    the stage's thread gives them back there."""
    permits = mp.get_context("spawn").Array("q", 2)
    admission, other = Admission(4, SharedLedger(permits, 0)), Admission(4, SharedLedger(permits, 1))
    with admission.try_acquire(3) as held:
        held.keep()  # its texts are queued for the tokeniser
    with pytest.raises(Overloaded, match="3 of 4 inputs in flight"):
        other.try_acquire(2)  # another worker sees them held
    thread = threading.Thread(target=held.let_go)  # the tokenisation thread, done with them
    thread.start()
    thread.join(10)
    assert list(permits[:]) == [0, 0]
    with other.try_acquire(4):
        assert admission.in_use == 4


def test_readiness_needs_every_worker() -> None:
    shared = Shared.create(mp.get_context("spawn"), 2, 2, "/nonexistent")
    first, second = Cluster(shared, 0), Cluster(shared, 1)
    first.set_ready(True)
    assert not first.all_ready() and not second.all_ready()
    second.set_ready(True)
    assert first.all_ready()


def test_readiness_counts_only_serving_slots() -> None:
    # Two workers and a spare slot: a replacement starting there, then serving in its old one's place.
    shared = Shared.create(mp.get_context("spawn"), 3, 2, "/nonexistent")
    first, second, spare = (Cluster(shared, i) for i in range(3))
    first.set_ready(True)
    second.set_ready(True)
    assert first.all_ready() and first.size == 2  # the empty spare slot does not count
    assert first.ready_count() == 2
    shared.serving[2], shared.serving[0] = 1, 0  # (the supervisor does this only once it is ready)
    assert not first.all_ready() and first.ready_count() == 1  # it is not
    spare.set_ready(True)
    assert first.all_ready() and spare.size == 2
    first.set_ready(False)  # the retiring worker shutting down
    assert second.all_ready()


def test_worker_count_auto_is_one_on_cpu_and_four_on_cuda() -> None:
    assert resolve_count(Settings(workers=3)) == 3
    assert resolve_count(Settings(providers="CPUExecutionProvider")) == 1
    cuda = Settings(providers="CUDAExecutionProvider,CPUExecutionProvider")
    assert resolve_count(cuda) == AUTO_CUDA_WORKERS


def test_a_replacement_warms_up_while_the_server_is_full_then_counts_in_its_ledger(
    tiny_model: Any, tiny_settings: Settings, tmp_path: Any
) -> None:
    from fastapi.testclient import TestClient

    from app.serving.factory import create_app

    # Slot 0 serves and holds every permit; slot 2 is the replacement starting beside it.
    limit = tiny_settings.max_concurrent_inputs
    shared = Shared.create(mp.get_context("spawn"), 3, 2, str(tmp_path))
    shared.permits[0] = limit
    cluster = Cluster(shared, 2, replacing="memory")
    with TestClient(create_app(tiny_settings, tiny_model, cluster)) as client:
        assert shared.ready[2] == 1  # warmed up: its warm-up counted its own permits
        assert client.post("/embed", json={"inputs": "你好"}).status_code == 429  # then the server's
        shared.permits[0] = 0
        assert client.post("/embed", json={"inputs": "你好"}).status_code == 200
    assert list(shared.permits[:]) == [0, 0, 0]


def test_each_model_has_its_budget_across_every_worker() -> None:
    """Two workers of a service of two models: a model's permits are counted over both workers, apart
    from the other model's, and a dead worker's are cleared for every model."""
    shared = Shared.create(mp.get_context("spawn"), 2, 2, "/nonexistent", models=2)
    first, second = Cluster(shared, 0), Cluster(shared, 1)
    embed = Admission(10, first.ledger_for(0), "embed")
    embed_there = Admission(10, second.ledger_for(0), "embed")
    rerank = Admission(10, first.ledger_for(1), "rerank")
    embed_there.try_acquire(8)  # held by the second worker, which then dies
    assert embed.in_use == 8 and rerank.in_use == 0
    with pytest.raises(Overloaded, match="model embed's budget is full: 8 of 10 inputs in flight"):
        embed.try_acquire(3)
    with rerank.try_acquire(10):  # the other model's budget is whole
        assert rerank.in_use == 10 and embed.in_use == 8
    assert first.ledger is not None and first.ledger.total() == 8  # the first model's, as with one
    from app.serving.slots import _forget

    class Dead:
        pid = None

    _forget(shared, 1, Dead())  # type: ignore[arg-type]
    assert embed.in_use == 0 and list(shared.permits[:]) == [0, 0, 0, 0]
