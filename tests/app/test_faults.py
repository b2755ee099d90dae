"""Faults: a Redis that is absent at start, killed under load or slowed, then back; a model folder that is
missing a graph, holds a corrupt one or fails its sha256; an exception inside one batch; and clients
that leave mid-request. The service keeps answering, counts what went wrong, and leaks nothing.

(A Redis stopped between requests, one never started and one paused by CLIENT PAUSE are in
tests/app/cache/test_redis_tier.py; these add load, a kill, a delaying proxy and a late start.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from app.settings import Settings
from loadtest.server import RedisServer, free_port
from tests.app.conftest import (
    Running,
    gate_inference,
    metric,
    serving,
    wait_until,
    with_cache,
)


class Load:
    """Threads posting /embed in a loop until stopped; every status is counted."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url = url
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def _loop(self, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                # One text repeats (a cache hit once Redis holds it), one is new each time.
                texts = ["压力之下重复的句子", f"线程 {index} 第 {n} 个新句子"]
                try:
                    status = client.post("/embed", json={"inputs": texts}).status_code
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.statuses[status] += 1

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def total(self) -> int:
        with self._lock:
            return sum(self.statuses.values())

    def wait_for(self, more: int) -> None:
        target = self.total() + more
        wait_until(lambda: self.total() >= target, seconds=120)


def assert_all_ok(load: Load) -> None:
    assert not load.errors, load.errors[:3]
    assert set(load.statuses) == {200}, load.statuses


# --- Redis -------------------------------------------------------------------------------------------


def redis_hits(client: httpx.Client) -> float:
    return metric(client, "zhembed_cache_hits_total", tier="redis")


def redis_errors(client: httpx.Client) -> float:
    return metric(client, "zhembed_cache_errors_total", tier="redis")


@pytest.mark.slow
def test_redis_absent_at_start_then_started(tiny_settings: Settings) -> None:
    port = free_port()
    # No in-process tier: every lookup goes to Redis; a short breaker so the late start is seen soon.
    settings = with_cache(
        tiny_settings, f"redis://127.0.0.1:{port}/0", cache_bytes=0, redis_max_backoff_s=0.2
    )
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        late = RedisServer(port=port)
        try:
            with Load(running.url) as load:
                load.wait_for(20)
                assert redis_errors(client) >= 1
                late.start()
                wait_until(lambda: redis_hits(client) >= 1, seconds=60)
        finally:
            late.stop()
        assert_all_ok(load)


@pytest.mark.slow
def test_redis_killed_under_load_then_back(tiny_settings: Settings, own_redis: RedisServer) -> None:
    settings = with_cache(tiny_settings, own_redis.url, cache_bytes=0, redis_max_backoff_s=0.2)
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        with Load(running.url) as load:
            wait_until(lambda: redis_hits(client) >= 1, seconds=60)
            errors_before = redis_errors(client)
            own_redis.kill()  # no goodbye on its connections, the way a crashed or OOM-killed Redis goes
            wait_until(lambda: redis_errors(client) > errors_before, seconds=60)
            load.wait_for(30)  # requests go on while Redis is gone
            hits_while_down = redis_hits(client)
            own_redis.start()
            wait_until(lambda: redis_hits(client) > hits_while_down, seconds=60)
        assert_all_ok(load)
        assert metric(client, "zhembed_failures_total", reason="internal") == 0


class DelayProxy:
    """A TCP proxy in front of Redis that holds each client→Redis chunk for ``delay`` seconds."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            upstream.settimeout(None)
            self._sockets += [downstream, upstream]
            threading.Thread(target=self._pump, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, delayed: bool) -> None:
        try:
            while data := source.recv(65536):
                if delayed and self.delay:
                    time.sleep(self.delay)
                target.sendall(data)
        except OSError:
            return  # either side closed: the client timed out, or the test ended
        finally:
            for sock in (source, target):
                sock.close()

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture()
def slow_redis(own_redis: RedisServer) -> Iterator[DelayProxy]:
    proxy = DelayProxy(own_redis.port)
    yield proxy
    proxy.close()


@pytest.mark.slow
def test_redis_slowed_then_back(tiny_settings: Settings, slow_redis: DelayProxy) -> None:
    settings = with_cache(
        tiny_settings, slow_redis.url, cache_bytes=0, redis_max_backoff_s=0.2, redis_timeout_ms=50.0
    )
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        with Load(running.url) as load:
            wait_until(lambda: redis_hits(client) >= 1, seconds=60)
            slow_redis.delay = 0.5  # ten times the 50 ms Redis timeout
            errors_before = redis_errors(client)
            wait_until(lambda: redis_errors(client) >= errors_before + 2, seconds=60)
            load.wait_for(20)
            slow_redis.delay = 0.0
            hits_while_slow = redis_hits(client)
            wait_until(lambda: redis_hits(client) > hits_while_slow, seconds=60)
        assert_all_ok(load)


# --- the model folder --------------------------------------------------------------------------------


def _missing_graph(folder: Path) -> None:
    (folder / "encoder.fp32.onnx").unlink()


def _sha256_mismatch(folder: Path) -> None:
    with (folder / "encoder.fp32.onnx").open("ab") as f:
        f.write(b"\0")


def _corrupt_graph_with_a_matching_sha256(folder: Path) -> None:
    """Garbage that the manifest vouches for: only ONNX Runtime can tell."""
    import hashlib

    garbage = b"this is not an ONNX graph" * 100
    (folder / "encoder.fp32.onnx").write_bytes(garbage)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["graphs"]["encoder"]["fp32"]["sha256"] = hashlib.sha256(garbage).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_missing_graph, ["encoder.fp32.onnx: missing"]),
        (_sha256_mismatch, ["encoder.fp32.onnx: sha256", "does not match the manifest"]),
        (_corrupt_graph_with_a_matching_sha256, ["ONNX Runtime cannot load the fp32 graphs"]),
    ],
)
def test_a_damaged_model_refuses_to_start_and_is_never_ready(
    tiny_model_dir: Path, tmp_path: Path, damage: Callable[[Path], None], words: list[str]
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    damage(folder)
    port = free_port()
    env = {**os.environ, "ZHEMBED_HOST": "127.0.0.1", "ZHEMBED_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--model", str(folder), "--variant", "fp32"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready_seen = False
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):  # nothing listening: as it should be
            ready_seen |= httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
        time.sleep(0.05)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, stderr
    assert not ready_seen
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zhembed: cannot start:"), stderr
    for word in words:
        assert word in lines[0], lines[0]


# --- the engine --------------------------------------------------------------------------------------


@pytest.fixture()
def one_per_batch(tiny_settings: Settings) -> Iterator[Running]:
    settings = tiny_settings.model_copy(update={"max_batch_size": 1, "warmup": False})
    with serving(settings) as running:
        yield running


def test_an_exception_in_one_batch_fails_only_its_request(
    one_per_batch: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = one_per_batch.service.model
    original: Callable[..., list[np.ndarray]] = model.encode
    calls = {"n": 0}
    lock = threading.Lock()

    def fails_once(*args: Any, **kwargs: Any) -> list[np.ndarray]:
        with lock:
            calls["n"] += 1
            first = calls["n"] == 1
        if first:
            raise RuntimeError("injected fault")
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "encode", fails_once)
    with httpx.Client(base_url=one_per_batch.url, timeout=60) as client, ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: client.post("/embed", json={"inputs": [f"批次 {i}"]}), range(4)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200, 200, 200, 500], [r.text for r in responses]
        failed = next(r for r in responses if r.status_code == 500)
        assert failed.json()["error_type"] == "internal"  # with an error id, not the fault's text
        assert failed.json()["error_id"] == failed.headers["x-error-id"]
        assert "RuntimeError" not in failed.text and "injected fault" not in failed.text
        assert client.post("/embed", json={"inputs": ["下一批"]}).status_code == 200  # the engine goes on
        assert metric(client, "zhembed_failures_total", reason="internal") == 1
        assert metric(client, "zhembed_inputs_in_flight") == 0


def test_clients_that_leave_mid_request_leave_no_work_and_no_leak(
    one_per_batch: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = one_per_batch.service
    gate = gate_inference(monkeypatch, one_per_batch)
    engine = service.engine
    leaving = 6
    host, port = one_per_batch.url.removeprefix("http://").split(":")
    sockets = []
    for i in range(leaving):
        body = orjson.dumps({"inputs": [f"等不及的客户 {i}"]})
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sockets.append(sock)
    # All admitted and handed to the batcher: one in inference (stuck at the gate), the rest queued.
    wait_until(lambda: engine.stats()["batched_items"] + engine.stats()["queue_depth"] == leaving)
    for sock in sockets:
        sock.close()

    # Permits come back while the batch already running is still stuck: nothing waits for work nobody reads.
    wait_until(lambda: engine.admission.in_use == 0)
    assert service.cache.in_flight == 0
    with httpx.Client(base_url=one_per_batch.url, timeout=60) as client:
        wait_until(lambda: metric(client, "zhembed_failures_total", reason="client_closed") == leaving)
        gate.set()

        def settled() -> bool:
            stats = engine.stats()
            return (
                stats["queue_depth"] == 0
                and stats["dropped_cancelled"] + engine.inference.stats.items == leaving
            )

        wait_until(settled)
        assert engine.inference.stats.items <= 1  # at most the batch that was running when they left
        assert client.post("/embed", json={"inputs": ["留下来的客户"]}).status_code == 200
        assert metric(client, "zhembed_inputs_in_flight") == 0
