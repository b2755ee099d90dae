"""Graceful shutdown of ``python -m app``: on SIGTERM readiness turns false, new requests get 503, requests
already accepted finish, and the process exits 0 within the grace period.

With one worker and with two (the supervisor forwards the signal; each worker drains alike), every
request of a stream sent across the signal ends one of three ways: answered (200), refused with
503 while draining, or refused by the OS once the listener has closed (a connect error, or a reset of a
connection the kernel had queued but the server never accepted: either way nothing was started, so a
client may safely retry elsewhere). Anything else — a reset during the drain, a timeout — is a lost or
hung request and fails the test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI

from app.api.drain import Drain
from app.serving.server import http_server
from app.settings import Settings
from loadtest.server import free_port

DRAIN_S = 2.0
GRACE_S = 15.0


class Subprocess:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        self.proc.wait(timeout=5)
        assert self.proc.stdout is not None
        return self.proc.stdout.read()


@contextmanager
def running_app(model: Path, workers: int, **settings: str) -> Iterator[Subprocess]:
    """``python -m app`` serving ``model`` with ``workers`` workers behind one port, ready; ``settings``:
    more ZHEMBED_ variables."""
    port = free_port()
    env = {
        **os.environ,
        "ZHEMBED_WORKERS": str(workers),
        "ZHEMBED_MODEL": str(model),
        "ZHEMBED_VARIANT": "fp32",
        "ZHEMBED_HOST": "127.0.0.1",
        "ZHEMBED_PORT": str(port),
        "ZHEMBED_INTRA_OP_THREADS": "1",
        "ZHEMBED_CACHE_BYTES": "0",
        "ZHEMBED_SHUTDOWN_DRAIN_S": str(DRAIN_S),
        "ZHEMBED_SHUTDOWN_GRACE_S": str(GRACE_S),
        **settings,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    running = Subprocess(proc, port)
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"python -m app exited with {proc.returncode}"
            assert time.monotonic() < deadline, "python -m app did not get ready"
            try:
                if httpx.get(running.url + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(params=[1, 2], ids=["1 worker", "2 workers"])
def app_process(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Subprocess]:
    """``python -m app`` serving the tiny model, in one process or as two workers behind one port."""
    with running_app(tiny_model_dir, request.param) as running:
        yield running


def open_accepted_request(port: int, body_length: int) -> socket.socket:
    """A POST /embed the server has accepted, its body still to come: sent with ``Expect: 100-continue``,
    and returned once the server's ``100 Continue`` says the route is reading the body (past the drain
    check; uvicorn sends it at the app's first read of the body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {body_length}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    sock.sendall(head)
    interim = b""
    while b"\r\n\r\n" not in interim:
        chunk = sock.recv(1)  # byte by byte: nothing of what follows the interim answer is read here
        assert chunk, "the server closed the connection instead of accepting the request"
        interim += chunk
    assert interim.startswith(b"HTTP/1.1 100"), interim
    return sock


def finish_accepted_request(sock: socket.socket, body: bytes) -> tuple[int, bytes]:
    sock.sendall(body)
    raw = b""
    while chunk := sock.recv(65536):  # the server closes the connection after answering
        raw += chunk
    sock.close()
    head = raw.partition(b"\r\n\r\n")[0]
    return int(head.split(b" ", 2)[1]), head


@pytest.mark.slow
def test_sigterm_drains_then_exits_0(app_process: Subprocess) -> None:
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    lock = threading.Lock()
    started = threading.Barrier(5)  # four senders and this test

    signalled: list[float] = []

    def sender(index: int) -> None:
        first = True
        while True:
            # A fresh connection each time: no pooled keep-alive connection can race the closing.
            try:
                response = httpx.post(
                    app_process.url + "/embed", json={"inputs": [f"第 {index} 个客户端", "关机"]}, timeout=30
                )
            except httpx.ConnectError:
                with lock:
                    outcomes["listener closed"] += 1
                return
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                # Reset without an answer. After the drain this is a connection the kernel had queued
                # when the listener closed: never accepted, so never started. Before it, a lost request.
                after_drain = bool(signalled) and time.monotonic() - signalled[0] >= DRAIN_S
                with lock:
                    if after_drain:
                        outcomes["listener closed"] += 1
                    else:
                        problems.append(f"{type(exc).__name__}: {exc}")
                return
            except httpx.HTTPError as exc:  # a timeout: a hung request
                with lock:
                    problems.append(f"{type(exc).__name__}: {exc}")
                return
            refused = response.status_code == 503 and response.json()["error_type"] == "unhealthy"
            with lock:
                outcomes[str(response.status_code)] += 1
                if refused and response.headers.get("connection") != "close":
                    problems.append("a 503 while draining left its connection open")
                elif not refused and response.status_code != 200:
                    problems.append(f"HTTP {response.status_code}: {response.text}")
            if first:
                first = False
                started.wait(timeout=60)

    threads = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    started.wait(timeout=60)  # every sender has had an answer: the stream spans the signal

    body = orjson.dumps({"inputs": ["信号之前就被接受的请求"] * 8})
    slow = open_accepted_request(app_process.port, len(body))  # accepted: the server is reading its body

    signalled.append(time.monotonic())
    app_process.proc.send_signal(signal.SIGTERM)

    with httpx.Client(base_url=app_process.url, timeout=10) as probe:
        while (ready := probe.get("/ready")).status_code == 200:
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["error_type"] == "unhealthy"
        assert probe.get("/health").status_code == 200  # alive while draining

    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a sender hung"
    # The listener has closed (every sender saw it); the request accepted before the signal still
    # has its body coming, and it is answered.
    status, head = finish_accepted_request(slow, body)
    assert status == 200, head

    assert app_process.proc.wait(timeout=GRACE_S + 15) == 0
    took = time.monotonic() - signalled[0]
    output = app_process.output()
    assert "draining" in output, output

    assert not problems, problems
    assert outcomes["200"] >= 4 and outcomes["503"] >= 1, outcomes
    assert outcomes["listener closed"] == 4, outcomes
    assert took >= DRAIN_S, took  # the listener stayed open for the whole drain


def test_sigterm_on_an_idle_server_exits_0(app_process: Subprocess) -> None:
    app_process.proc.send_signal(signal.SIGTERM)
    assert app_process.proc.wait(timeout=GRACE_S + 15) == 0
    assert "stopped" in app_process.output()


def test_a_drain_longer_than_the_grace_period_is_refused() -> None:
    with pytest.raises(ValueError, match="shutdown_drain_s"):
        Settings(shutdown_drain_s=30, shutdown_grace_s=10)


def _request_on(sock: socket.socket, body: bytes) -> int:
    """One keep-alive POST /embed on ``sock``; the status, or 0 if the server had closed the connection."""
    head = (
        f"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        if not chunk:
            return 0
        raw += chunk
    header, _, rest = raw.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in header.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(header.split(b" ", 2)[1])


def test_the_keep_alive_outlasts_uvicorns_default() -> None:
    # uvicorn closes idle connections after 5 s; a load balancer reusing one then fails a request.
    app = FastAPI()
    app.state.drain = Drain()
    app.state.cluster = None  # one process, as create_app leaves it
    configured = http_server(app, Settings()).config.timeout_keep_alive
    assert configured == Settings().keep_alive_s == 75 > uvicorn.Config(app).timeout_keep_alive == 5


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2], ids=["1 worker", "2 workers"])
def test_an_idle_keep_alive_connection_lasts_the_setting(tiny_model_dir: Path, workers: int) -> None:
    # With a 1 s keep-alive, so that waiting for the server to close the connection takes 1 s, not 75.
    body = orjson.dumps({"inputs": "你好"})
    with (
        running_app(tiny_model_dir, workers, ZHEMBED_KEEP_ALIVE_S="1") as app_process,
        socket.create_connection(("127.0.0.1", app_process.port), timeout=30) as sock,
    ):
        assert _request_on(sock, body) == 200
        assert _request_on(sock, body) == 200  # kept open between requests
        answered = time.monotonic()
        assert sock.recv(1) == b""  # waits for the server to close it: idle for its keep-alive
        # uvicorn starts the timer as the answer leaves; its arrival here came after that.
        assert time.monotonic() - answered > 0.5


def test_sigterm_while_the_workers_load_exits_0(tiny_model_dir: Path) -> None:
    """A worker told to stop before it serves (its model still loading) ends with 0, not by the signal."""
    import psutil

    port = free_port()
    env = {
        **os.environ,
        "ZHEMBED_WORKERS": "2",
        "ZHEMBED_MODEL": str(tiny_model_dir),
        "ZHEMBED_VARIANT": "fp32",
        "ZHEMBED_HOST": "127.0.0.1",
        "ZHEMBED_PORT": str(port),
        "ZHEMBED_INTRA_OP_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        supervisor = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        # Both workers started (spawned: they import and load for a second or more); none serves yet.
        while len([c for c in supervisor.children() if "spawn_main" in " ".join(c.cmdline())]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GRACE_S + 30) == 0, Subprocess(proc, port).output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
