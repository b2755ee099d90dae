"""The engine on the grid of shapes: warmed before the first batch (and /ready), planned by grid costs,
and the same vectors as exact shapes through a real server (app/model/shaped.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from app.engine.engine import Engine
from app.engine.work import Job, Need, Seq
from app.model.grid import warm_shapes
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings
from app.telemetry.metrics import Metrics
from tests.app.conftest import serving


@pytest.fixture(scope="module")
def on_grid(tiny_settings: Settings) -> Settings:
    return tiny_settings.model_copy(update={"shape_grid": "on", "max_batch_size": 8, "max_batch_tokens": 512})


@pytest.fixture(scope="module")
def grid_model(on_grid: Settings) -> OnnxModel:
    return load_model(on_grid)


def test_calibration_warms_every_shape_then_plans_by_grid_costs(
    grid_model: OnnxModel, on_grid: Settings
) -> None:
    engine = Engine(grid_model, on_grid.model_copy(update={"measure_batch_cost": False}), Metrics())
    shapes = grid_model.shapes
    assert shapes is not None
    engine._calibrate()  # what the inference thread runs before its first batch
    assert engine.calibrated.is_set() and shapes.warmed is not None
    assert shapes.warmed.shapes == len(warm_shapes(shapes.grid, engine.limits.room)) > 0
    assert engine.batcher.costs.grid is shapes.grid
    assert engine.batcher.costs.cost(3, 20) == engine.batcher.costs.cost(4, 32)


def test_a_batch_on_the_grid_counts_its_padded_shape_as_computed(
    grid_model: OnnxModel, on_grid: Settings
) -> None:
    engine = Engine(grid_model, on_grid.model_copy(update={"measure_batch_cost": False}), Metrics())
    engine._calibrate()
    now = engine.clock.now()
    seq = Seq(
        np.zeros(20, dtype=np.int64),
        Need(layers=(1,), pooling="cls"),
        Job(asyncio.new_event_loop(), 1),
        0,
        now - 1,
    )
    engine.batcher.submit([seq])
    offer = engine.batcher.offer(now)
    assert offer is not None and engine.batcher.cut(offer, False) == [seq]
    stats = engine.batcher.stats
    assert (stats.real_tokens, stats.padded_tokens) == (20, 32)  # one row of 20 runs as 1 x 32


def test_a_failed_warm_up_fails_the_thread_not_the_wait_for_ready(
    grid_model: OnnxModel, on_grid: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(grid_model, on_grid, Metrics())

    def broken(room: Any) -> None:
        raise RuntimeError("out of device memory")

    monkeypatch.setattr(grid_model.shapes, "warm", broken)
    with pytest.raises(RuntimeError, match="device memory"):
        engine._calibrate()
    assert engine.calibrated.is_set()  # /ready's wait ends; the thread's fault answers (a 503, replaced)


def test_a_grid_server_answers_what_exact_shapes_answer_and_shows_its_grid(
    client: httpx.Client, on_grid: Settings
) -> None:
    texts = ["北京天气很好", "我们去公园散步吧，上海是中国的城市", "人", "中国人民" * 9]
    bodies = [{"inputs": texts}, {"inputs": texts, "pooling": "cls", "layers": [1, 3]}]
    with serving(on_grid) as running, httpx.Client(base_url=running.url, timeout=60) as grid_client:
        info = grid_client.get("/info").json()["batching"]["shape_grid"]
        for body in bodies:
            exact = np.array(client.post("/embed", json=body).json())
            padded = np.array(grid_client.post("/embed", json=body).json())
            np.testing.assert_allclose(padded, exact, rtol=1e-5, atol=1e-5)
    assert (
        info["warmed_shapes"] > 0 and info["warmup_s"] is not None and info["shapes"] >= info["warmed_shapes"]
    )
    assert info["rows"] == [1, 2, 4, 8] and info["lengths"][:2] == [16, 32] and info["io_binding"] is True
    assert info["cuda_graphs"] is False and info["cuda_graphs_captured"] == 0  # the CPU cannot capture
    assert client.get("/info").json()["batching"]["shape_grid"] is None  # the CPU's default: exact shapes
