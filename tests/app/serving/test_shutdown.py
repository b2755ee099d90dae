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
from pathlib import Path

import httpx
import orjson
import pytest

from app.settings import Settings
from tests.app.conftest import free_port

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


@pytest.fixture(params=[1, 2], ids=["1 worker", "2 workers"])
def app_process(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Subprocess]:
    """``python -m app`` serving the tiny model, in one process or as two workers behind one port."""
    port = free_port()
    env = {
        **os.environ,
        "ZHEMBED_WORKERS": str(request.param),
        "ZHEMBED_MODEL": str(tiny_model_dir),
        "ZHEMBED_VARIANT": "fp32",
        "ZHEMBED_HOST": "127.0.0.1",
        "ZHEMBED_PORT": str(port),
        "ZHEMBED_INTRA_OP_THREADS": "1",
        "ZHEMBED_CACHE_BYTES": "0",
        "ZHEMBED_SHUTDOWN_DRAIN_S": str(DRAIN_S),
        "ZHEMBED_SHUTDOWN_GRACE_S": str(GRACE_S),
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


def open_slow_request(port: int, body: bytes, sent: int) -> socket.socket:
    """A POST /embed whose headers and first ``sent`` body bytes are on the wire; the rest comes later."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body[:sent])
    return sock


def finish_slow_request(sock: socket.socket, rest: bytes) -> tuple[int, bytes]:
    sock.sendall(rest)
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
    slow = open_slow_request(app_process.port, body, sent=len(body) // 2)
    time.sleep(1.0)  # let the server read the request line and headers: the request is accepted

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
    status, head = finish_slow_request(slow, body[len(body) // 2 :])
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


@pytest.mark.slow
def test_an_idle_keep_alive_connection_stays_open_past_uvicorns_default(app_process: Subprocess) -> None:
    # uvicorn closes idle connections after 5 s; a load balancer reusing one then fails a request.
    body = orjson.dumps({"inputs": "你好"})
    with socket.create_connection(("127.0.0.1", app_process.port), timeout=30) as sock:
        assert _request_on(sock, body) == 200
        time.sleep(6.5)
        assert _request_on(sock, body) == 200
