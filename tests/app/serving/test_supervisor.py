"""Several workers behind one port, as ``python -m app`` starts them: each serves, one /metrics counts
them all, the server's budget holds, a killed worker is replaced, a worker past the memory bound is
replaced with nothing lost, drain, faults. The supervisor's decisions on their own, with fakes, are in
test_slots.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.server import free_port
from tests.app.conftest import Running, wait_until


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"


def start(model: Path, port: int, **env: str) -> subprocess.Popen[str]:
    variables = {
        **os.environ,
        "ZHEMBED_MODEL": str(model),
        "ZHEMBED_VARIANT": "fp32",
        "ZHEMBED_HOST": "127.0.0.1",
        "ZHEMBED_PORT": str(port),
        "ZHEMBED_WORKERS": "2",
        "ZHEMBED_CACHE_BYTES": "0",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "app"],
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def start_ready(model: Path, **env: str) -> Server:
    """Two workers serving ``model``, once ``/ready`` says so."""
    port = free_port()
    server = Server(start(model, port, **env), port)
    wait_until(lambda: ready(server.url) or server.proc.poll() is not None, seconds=120, every=0.1)
    assert server.proc.poll() is None, server.proc.communicate()[0]
    return server


@pytest.fixture(scope="module")
def two_workers(tiny_model_dir: Path) -> Iterator[Server]:
    server = start_ready(
        tiny_model_dir, ZHEMBED_MAX_CONCURRENT_INPUTS="64", ZHEMBED_MAX_INPUTS_PER_REQUEST="16"
    )
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(30)
            except subprocess.TimeoutExpired:
                server.proc.kill()


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "zhembed_requests_total" and sample.labels.get("route") == "/embed":
                out[f"embed_{sample.labels['status']}"] += sample.value
            elif sample.name in ("zhembed_workers_ready", "zhembed_inputs_in_flight"):
                out[sample.name] = sample.value
    return out


@pytest.mark.slow
def test_both_workers_serve_and_one_scrape_counts_them_all(two_workers: Server) -> None:
    before = scrape(two_workers.url)
    served_by: set[int] = set()
    for i in range(40):
        with httpx.Client(base_url=two_workers.url, timeout=30) as client:  # a fresh connection each time
            assert client.post("/embed", json={"inputs": [f"第{i}句"]}).status_code == 200
            served_by.add(client.get("/info").json()["worker"]["pid"])
    after = scrape(two_workers.url)
    assert after["embed_200"] - before.get("embed_200", 0) == 40  # whichever worker answered each
    assert after["zhembed_workers_ready"] == 2
    assert len(served_by) == 2, served_by


def worker_pids(proc: subprocess.Popen[str]) -> set[int]:
    """The worker processes of the supervisor ``proc`` (not multiprocessing's resource tracker)."""
    pids = {int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
    workers = set()
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):  # (one that has just exited)
            if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text():
                workers.add(pid)
    return workers


def replacements(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200, response.text
    text = response.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "zhembed_worker_replacements_total" and sample.labels["reason"] == "memory"
    )


@pytest.mark.slow
def test_a_worker_past_the_memory_bound_is_replaced_with_nothing_lost(
    tiny_model_dir: Path, two_workers: Server
) -> None:
    # A bound below what any worker holds: each is replaced once it is ready, one at a time, under the
    # traffic (a bound just above a started worker waited on how fast memory grows: minutes, or never).
    bound_mb = 1
    server = start_ready(
        tiny_model_dir, ZHEMBED_WORKER_MAX_MEMORY_MB=str(bound_mb), ZHEMBED_INTRA_OP_THREADS="1"
    )
    first = worker_pids(server.proc)
    statuses: Counter[int | str] = Counter()
    not_ready: list[int] = []
    stop = threading.Event()

    def client(index: int) -> None:  # one keep-alive connection at a time, texts never sent before
        with httpx.Client(base_url=server.url, timeout=60) as http:
            sent = 0
            while not stop.is_set():
                body = {"inputs": [f"客户端{index}的第{sent}批第{j}句" for j in range(64)]}
                sent += 1
                try:
                    statuses[http.post("/embed", json=body).status_code] += 1
                except httpx.HTTPError as exc:  # a lost request
                    statuses[type(exc).__name__] += 1

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                if (status := http.get("/ready").status_code) != 200:
                    not_ready.append(status)
                stop.wait(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)] + [
        threading.Thread(target=probe)
    ]
    for thread in threads:
        thread.start()
    try:
        # Replaced: counted, and the old worker gone while two others serve.
        def replaced() -> bool:
            now = worker_pids(server.proc)
            return replacements(server.url) >= 1 and len(now) == 2 and now != first

        wait_until(lambda: replaced() or server.proc.poll() is not None, seconds=180, every=0.2)
        assert server.proc.poll() is None
        wait_until(lambda: statuses[200] >= 20, every=0.1)  # and serving after it
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        server.proc.send_signal(signal.SIGTERM)
        output, _ = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 0, output
    assert set(statuses) == {200}, statuses
    assert not_ready == [], not_ready
    assert f"past the bound of {bound_mb} MB" in output, output
    assert "retires" in output and "retired: no connection left" in output, output
    assert "starting another" not in output, output  # replaced, not crashed


@pytest.mark.slow
def test_both_workers_plan_by_one_cost_model_measured_once(two_workers: Server) -> None:
    models: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    while len(models) < 2 and time.monotonic() < deadline:
        with httpx.Client(base_url=two_workers.url, timeout=30) as client:  # a fresh connection each time
            info = client.get("/info").json()
            models[info["worker"]["pid"]] = info["batching"]["cost_model"]
    assert len(models) == 2
    first, second = models.values()
    # One grid of measured batch times (a worker refits a, b, c, d from the batches it serves, so those
    # may part once the other tests have sent traffic; the grid they started from does not).
    measured = [([g["measured"] for g in m["grid"]], m["key"]) for m in (first, second)]
    assert measured[0] == measured[1] and measured[0][0] and first["unit"] == "ms"
    # The first worker to start measured it (unless an earlier server had); the other read its result.
    assert sum(m["source"].startswith("measured") for m in (first, second)) <= 1


@pytest.mark.slow
def test_past_the_servers_budget_only_200_or_429_and_nothing_leaks(two_workers: Server) -> None:
    async def flood() -> Counter[int]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=two_workers.url, timeout=60, limits=limits) as client:
            bodies = [{"inputs": [f"请求{i}的第{j}句话" * 8 for j in range(16)]} for i in range(48)]
            responses = await asyncio.gather(*(client.post("/embed", json=b) for b in bodies))
        for r in responses:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1" and r.json()["error_type"] == "overloaded"
        return Counter(r.status_code for r in responses)

    statuses = asyncio.run(flood())
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] >= 4, statuses  # the budget admits four such requests at a time
    wait_until(lambda: scrape(two_workers.url).get("zhembed_inputs_in_flight") == 0, every=0.6)


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_server_keeps_serving(tiny_model_dir: Path) -> None:
    server = start_ready(tiny_model_dir, ZHEMBED_WARMUP="false")
    proc, url = server.proc, server.url
    try:
        victim = httpx.get(url + "/info", timeout=10).json()["worker"]["pid"]
        os.kill(victim, signal.SIGKILL)
        statuses: Counter[int] = Counter()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (statuses[200] >= 20 and ready(url)):
            with httpx.Client(base_url=url, timeout=30) as client:
                statuses[client.post("/embed", json={"inputs": "还在吗"}).status_code] += 1
        assert set(statuses) == {200}, statuses
        assert ready(url)
        pids = {httpx.get(url + "/info", timeout=10).json()["worker"]["pid"] for _ in range(30)}
        assert victim not in pids
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "starting another" in output, output


def test_a_damaged_model_stops_the_server_before_any_worker_starts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "encoder.fp32.onnx").unlink()
    proc = start(folder, free_port())
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output
    lines = [line for line in output.strip().splitlines() if line.startswith("zhembed")]
    assert len(lines) == 1 and "encoder.fp32.onnx: missing" in lines[0], output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
def test_no_worker_outlives_a_killed_supervisor(tiny_model_dir: Path) -> None:
    proc = start_ready(tiny_model_dir, ZHEMBED_WARMUP="false").proc
    try:
        pids = worker_pids(proc)
        assert len(pids) == 2, pids
        proc.kill()  # SIGKILL: the supervisor cannot forward anything
        proc.wait(10)
        wait_until(lambda: not any(_alive(p) for p in pids), seconds=60, every=0.1)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_two_workers_answer_the_option_combinations_as_one_process_does(
    two_workers: Server, server: Running
) -> None:
    """Issue 19's vectors-unchanged target with 2 workers: the pooled-in-graph answers of each worker
    equal the in-process server's (which equal numpy pooling's: tests/app/engine/test_graph_pooling.py)."""
    from tests.app.engine.test_graph_pooling import SHORT, bodies, decoded, tolerance

    cases = list(bodies())[::5]  # a spread of the combinations; every one runs in the 1-process test
    served_by: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=60) as one:
        for body in cases:
            body = {**body, "inputs": SHORT}  # within the 2-worker server's 16 inputs and 64 in flight
            with httpx.Client(base_url=two_workers.url, timeout=60) as two:  # a fresh connection: any worker
                got = two.post("/embed", json=body)
                served_by.add(two.get("/info").json()["worker"]["pid"])
            want = one.post("/embed", json=body)
            assert got.status_code == want.status_code == 200, (body, got.text)
            for g, w in zip(got.json(), want.json(), strict=True):
                np.testing.assert_allclose(
                    decoded(g, body["encoding"]),
                    decoded(w, body["encoding"]),
                    rtol=0,
                    atol=tolerance(body) if body["encoding"] != "int8" else 1.01 * w["scale"] + 1e-6,
                    err_msg=str(body),
                )
    assert len(served_by) == 2, served_by


@pytest.mark.slow
def test_two_workers_serve_two_models_each(tiny_model_dir: Path, tiny_reranker_dir: Path) -> None:
    """Every worker loads every model (the supervisor resolved and verified them once, before the workers
    started); a request gets its model whichever worker accepts it, and one scrape counts each model."""
    models = f"embed={tiny_model_dir},rerank={tiny_reranker_dir}"
    server = start_ready(tiny_model_dir, ZHEMBED_MODELS=models)
    try:
        served_by: set[int] = set()
        for i in range(30):
            with httpx.Client(base_url=server.url, timeout=30) as client:  # one connection: one worker
                ranks = client.post("/rerank", json={"query": "北京", "texts": [f"第{i}句", "北京今天晴"]})
                assert ranks.status_code == 200 and len(ranks.json()) == 2
                info = client.get("/info").json()
                served_by.add(info["worker"]["pid"])
                assert [m["model_id"] for m in info["models"]] == ["embed", "rerank"]
                assert [m["batching"]["max_concurrent_inputs"] for m in info["models"]] == [256, 256]
        assert len(served_by) == 2
        text = httpx.get(server.url + "/metrics", timeout=10).text
        counted = [
            line
            for line in text.splitlines()
            if line.startswith("zhembed_requests_total{") and 'model="rerank"' in line and "/rerank" in line
        ]
        assert counted and sum(float(line.rpartition(" ")[2]) for line in counted) == 30
    finally:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
