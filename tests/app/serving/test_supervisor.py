"""Several workers behind one port, as ``python -m app`` starts them: each serves, one /metrics counts
them all, the server's budget holds, a killed worker is replaced, a worker past the memory bound is
replaced with nothing lost, drain, faults; and the supervisor's decisions on their own, with fakes."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
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

from app.serving.cluster import Cluster, Shared
from app.serving.memory import memory_bytes
from app.serving.slots import MB, MEMORY_CHECK_S, MIN_UPTIME_S, RETIRE_SIGNAL, Slots
from tests.app.conftest import Running, free_port, wait_until


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

    text = httpx.get(url + "/metrics", timeout=10).text
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
        time.sleep(MIN_UPTIME_S)  # past the start-up window, where a death stops the server
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


# --- the supervisor's decisions (Slots), with fake processes, memory and clock ----------------------


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid: int | None = pid
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.exitcode is None


class Fakes:
    """Two workers bounded to 100 MB, one spare slot; every process, reading and signal is recorded."""

    def __init__(self, count: int = 2, bound_mb: int = 100) -> None:
        self.now = 1000.0
        self.started: list[tuple[int, str | None, FakeProc]] = []
        self.memory_mb: dict[int, float] = {}
        self.killed: list[tuple[int, int]] = []
        self.shared = Shared.create(mp.get_context("spawn"), count + 1, count, "/nonexistent")
        self.slots = Slots(
            count,
            self.shared,
            self.start,
            bound_bytes=bound_mb * MB,
            retire_s=5.0,
            memory=lambda pid: int(self.memory_mb[pid] * MB) if pid in self.memory_mb else None,
            kill=lambda pid, sig: self.killed.append((pid, sig)),
            clock=lambda: self.now,
        )

    def start(self, index: int, replacing: str | None) -> FakeProc:
        proc = FakeProc(100 + len(self.started))
        self.started.append((index, replacing, proc))
        return proc

    def proc(self, index: int) -> FakeProc:
        slot = self.slots.slots[index]
        assert slot is not None
        return slot.proc  # type: ignore[return-value]

    def step(self, seconds: float = MEMORY_CHECK_S) -> None:
        self.now += seconds
        assert self.slots.step()

    def serving(self) -> list[int]:
        return list(self.shared.serving[:])


def test_a_worker_past_the_bound_is_replaced_first_and_retired_once_the_replacement_is_ready() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    old = f.proc(0)
    f.memory_mb = {old.pid: 150, f.proc(1).pid: 80}  # type: ignore[dict-item]
    f.step()
    assert [(i, why) for i, why, _ in f.started[2:]] == [(2, "memory")]  # in the spare slot
    assert f.killed == [] and f.serving() == [1, 1, 0]  # the old one still serves, the new one not yet
    assert Cluster(f.shared, 0).all_ready()  # its not-yet-ready slot does not make /ready false
    for _ in range(5):  # still starting: nothing more happens, and nothing starts twice
        f.step()
    assert len(f.started) == 3 and f.killed == []
    f.shared.ready[2] = 1
    f.step(0.1)
    assert f.killed == [(old.pid, RETIRE_SIGNAL)]
    assert f.serving() == [0, 1, 1] and Cluster(f.shared, 1).all_ready()
    for _ in range(3):  # retiring, and still past the bound: not retired again, nothing new started
        f.step()
    assert f.killed == [(old.pid, RETIRE_SIGNAL)] and len(f.started) == 3
    old.exitcode = 0
    f.step(0.1)
    assert f.slots.slots[0] is None and f.shared.ready[0] == 0  # forgotten: the spare slot now


def test_one_replacement_at_a_time() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150, f.proc(1).pid: 150}  # type: ignore[dict-item]
    f.step()
    assert [i for i, _, _ in f.started[2:]] == [2]  # the second waits: the pod holds one worker more
    f.shared.ready[2] = 1
    f.step()
    f.memory_mb[f.proc(2).pid] = 50  # type: ignore[index]
    f.step()
    assert len(f.started) == 3  # no free slot until the retiring worker has exited
    f.proc(0).exitcode = 0
    f.step()
    f.step()
    assert [(i, why) for i, why, _ in f.started[3:]] == [(0, "memory")]  # now the second, in the freed slot


def test_no_bound_no_replacement_and_memory_is_published() -> None:
    f = Fakes(bound_mb=0)
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 5000, f.proc(1).pid: 60}  # type: ignore[dict-item]
    f.step()
    assert len(f.started) == 2 and f.killed == []
    assert list(f.shared.memory[:2]) == [5000 * MB, 60 * MB]


def test_a_worker_not_yet_ready_is_not_replaced_for_its_memory() -> None:
    f = Fakes()
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]  # e.g. a peak while loading
    f.step()
    assert len(f.started) == 2


def test_a_replacement_that_dies_while_starting_is_started_again_or_stops_the_server() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]
    f.step()
    f.step(MIN_UPTIME_S)
    f.proc(2).exitcode = 1  # past its start-up window: started again, still to replace worker 0
    f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(2, "memory"), (2, "memory")]
    f.shared.ready[2] = 1
    f.step(0.1)
    assert f.killed == [(f.proc(0).pid, RETIRE_SIGNAL)]

    g = Fakes()
    g.shared.ready[0] = g.shared.ready[1] = 1
    g.memory_mb = {g.proc(0).pid: 150}  # type: ignore[dict-item]
    g.step()
    g.proc(2).exitcode = 1  # right after its start: the server stops
    g.now += 0.1
    assert g.slots.step() is False and g.slots.failed
    assert g.killed == []  # the old worker was never told to retire


def test_a_worker_that_crashes_while_its_replacement_starts_is_taken_over_by_it() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]
    f.step(MIN_UPTIME_S)
    f.proc(0).exitcode = -9
    f.step(0.1)
    assert len(f.started) == 3 and f.slots.slots[0] is None  # no second replacement
    assert f.serving() == [0, 1, 1] and not Cluster(f.shared, 1).all_ready()  # until it is ready
    f.shared.ready[2] = 1
    assert Cluster(f.shared, 1).all_ready()


def test_a_crashed_worker_is_replaced_in_its_slot_as_a_crash() -> None:
    f = Fakes(bound_mb=0)
    f.step(MIN_UPTIME_S)
    f.proc(1).exitcode = -9
    f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(1, "crash")]


def test_a_stuck_retiring_worker_is_killed() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    old = f.proc(0)
    f.memory_mb = {old.pid: 150}  # type: ignore[dict-item]
    f.step()
    f.shared.ready[2] = 1
    f.step(0.1)
    f.step(f.slots.retire_kill_s + 1)
    assert f.killed == [(old.pid, RETIRE_SIGNAL), (old.pid, signal.SIGKILL)]


def test_the_memory_reader_reads_this_process() -> None:
    mine = memory_bytes(os.getpid())
    assert mine is not None and 1 * MB < mine < 64 * 1024 * MB
    assert memory_bytes(2**22 + 12345) is None  # past pid_max: no such process
