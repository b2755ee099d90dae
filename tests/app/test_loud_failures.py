"""A worker that cannot serve says so (issue 50): a warm-up that fails turns /health 503 and stops the
process with a non-zero exit status (one process: 1; a worker of several is replaced); an exception anywhere around a batch's run fails
only that batch; an inference thread that dies turns /health 503 and answers what waits with 503; a 500
tells the client an error id, never the fault's text, which the log holds under that id.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from app.serving.factory import create_app
from app.settings import Settings
from loadtest.server import free_port
from tests.app.conftest import Running, serving, wait_until

# Past the tiny model's 128 position embeddings.
TOO_LONG = 512


def model_longer_than_its_graph(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny model whose manifest lets its tokeniser make sequences longer than the graph's
    position embeddings hold. It loads (the manifest is not among the files checked by sha256) and serves
    short texts, but its warm-up's longest batch fails in ONNX Runtime, as a batch too large for the
    device's memory would."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tokenizer"]["max_length"] = TOO_LONG
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _env(port: int, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "ZHEMBED_HOST": "127.0.0.1",
        "ZHEMBED_PORT": str(port),
        "ZHEMBED_INTRA_OP_THREADS": "1",
        "ZHEMBED_CACHE_BYTES": "0",
        **more,
    }


def _app_exit(folder: Path, workers: int) -> subprocess.CompletedProcess[str]:
    """``python -m app`` on ``folder`` with ``workers`` workers, to its exit (a hang fails the test)."""
    command = [sys.executable, "-m", "app", "--model", str(folder), "--variant", "fp32"]
    env = _env(free_port(), ZHEMBED_WORKERS=str(workers))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


# --- warm-up ---------------------------------------------------------------------------------------------


def test_a_failed_warm_up_turns_health_and_ready_503_with_why(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = model_longer_than_its_graph(tiny_model_dir, tmp_path)
    settings = Settings(model=str(folder), variant="fp32", intra_op_threads=1, cache_bytes=0, max_wait_ms=2)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning", loop="asyncio")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 60)
        port = server.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_until(lambda: client.get("/health").status_code == 503, 60)
            health = client.get("/health").json()
            assert health["error_type"] == "unavailable"
            assert "warm-up" in health["error"] and "error id" in health["error"]
            assert "ONNX" not in health["error"]  # the fault's text is in the log, not here
            assert client.get("/ready").status_code == 503
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_single_process_whose_warm_up_fails_exits_1(tiny_model_dir: Path, tmp_path: Path) -> None:
    finished = _app_exit(model_longer_than_its_graph(tiny_model_dir, tmp_path), workers=1)
    assert finished.returncode == 1, finished.stderr[-3000:]
    assert "warm-up of" in finished.stderr and "failed (error id" in finished.stderr
    assert "stopping for a fault" in finished.stderr


@pytest.mark.slow
def test_workers_whose_warm_up_fails_are_replaced_then_stop_the_server(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    finished = _app_exit(model_longer_than_its_graph(tiny_model_dir, tmp_path), workers=2)
    assert finished.returncode == 1, finished.stderr[-3000:]
    # Each worker's start fails (uvicorn exits 3 when the lifespan raises): replaced as a crash, and the
    # third in a row with none ready stops the server.
    assert "exited with 3; starting another" in finished.stderr
    assert "the 3-th to with none ready since; stopping" in finished.stderr


# --- the inference thread --------------------------------------------------------------------------------


@pytest.fixture()
def one_per_batch(tiny_settings: Settings) -> Iterator[Running]:
    settings = tiny_settings.model_copy(update={"max_batch_size": 1, "warmup": False})
    with serving(settings) as running:
        yield running


def _once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, but the first call raises."""
    calls: list[None] = []

    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        if len(calls) == 1:
            raise RuntimeError("injected fault in /srv/secret/node_17")
        return original(*args, **kwargs)

    return faulty


@pytest.mark.parametrize("where", ["Batcher.ran", "Metrics.batch_ran", "split_batch"])
def test_a_fault_around_the_run_fails_only_its_batch_and_the_next_request_is_served(
    one_per_batch: Running, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    import app.engine.inference as inference_module

    inference = one_per_batch.service.engine.inference
    if where == "Batcher.ran":
        monkeypatch.setattr(inference.batcher, "ran", _once(inference.batcher.ran))
    elif where == "Metrics.batch_ran":
        monkeypatch.setattr(inference.metrics, "batch_ran", _once(inference.metrics.batch_ran))
    else:
        monkeypatch.setattr(inference_module, "split_batch", _once(inference_module.split_batch))
    with caplog.at_level(logging.ERROR), httpx.Client(base_url=one_per_batch.url, timeout=30) as client:
        failed = client.post("/embed", json={"inputs": ["第一批"]})
        assert failed.status_code == 500, failed.text
        assert client.post("/embed", json={"inputs": ["下一批"]}).status_code == 200  # the thread goes on
    error_id = failed.json()["error_id"]
    assert failed.headers["x-error-id"] == error_id and "secret" not in failed.text
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert "injected fault in /srv/secret/node_17" in record.getMessage()


class Killed(BaseException):
    """What no ``except Exception`` catches: the inference thread dies of it."""


def test_a_dead_inference_thread_turns_health_503_and_answers_what_waits_503(
    one_per_batch: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = one_per_batch.service
    running = threading.Event()
    die = threading.Event()

    def dies(*args: Any, **kwargs: Any) -> list[np.ndarray]:
        running.set()
        assert die.wait(timeout=120), "the test never let it die"
        raise Killed()

    monkeypatch.setattr(service.model, "encode", dies)
    with httpx.Client(base_url=one_per_batch.url, timeout=30) as client, ThreadPoolExecutor(2) as pool:
        assert client.get("/health").status_code == 200
        running_one = pool.submit(client.post, "/embed", json={"inputs": ["在跑的"]})
        assert running.wait(timeout=30)
        queued = pool.submit(client.post, "/embed", json={"inputs": ["排队的"]})
        wait_until(lambda: service.engine.batcher.depth == 1)
        die.set()
        for answered in (running_one.result(), queued.result()):
            assert answered.status_code == 503, answered.text
            assert answered.json()["error_type"] == "unavailable"
        later = client.post("/embed", json={"inputs": ["后来的"]})
        assert later.status_code == 503 and later.json()["error_type"] == "unavailable"
        health = client.get("/health")
        assert health.status_code == 503 and "inference thread stopped: Killed" in health.json()["error"]
