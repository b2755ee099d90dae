"""Start a service (ours or a baseline) as a subprocess on a free port, wait for it, measure it, stop it;
and a Redis beside it (the soak's faults and the service tests both start theirs here)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import redis

HOST = "127.0.0.1"


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text exposition → ``{"name{labels}": value}`` (comments skipped)."""
    series: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        series[name] = float(value)
    return series


def get(port: int, path: str) -> httpx.Response:
    """One GET of the service on ``port`` (httpx.TransportError when nothing listens), given 30 s: a scrape
    under a heavy load waits for the event loop."""
    return httpx.get(f"http://{HOST}:{port}{path}", timeout=30)


def post(port: int, path: str, body: bytes) -> httpx.Response:
    """One JSON POST to the service on ``port``, however long it takes."""
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"http://{HOST}:{port}{path}", content=body, headers=headers, timeout=None)


class DidNotStart(RuntimeError):
    """The service exited, or did not answer ready in time; the message ends with its log's last lines."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServiceProcess:
    """``python -m <module>`` with ``env`` added, listening on a free port, started in ``cwd`` (``python -m``
    imports from there first: another checkout's tree); a context manager. Started directly (no shell), so
    that ``pid`` is the server's own process, the root of the tree :mod:`loadtest.procs` reads.
    """

    def __init__(self, module: str, env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.cwd = cwd
        self.port = free_port()
        self.module = module
        self.env = {**os.environ, **env, "ZHEMBED_PORT": str(self.port), "ZHEMBED_HOST": HOST}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the service is not started"
        return self.proc.pid

    def start(self, timeout_s: float = 300.0) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._failed(f"{self.module} exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.TransportError):  # not listening yet
                if get(self.port, "/ready").status_code == 200:
                    return
            time.sleep(0.2)
        raise self._failed(f"{self.module} not ready after {timeout_s:.0f} s")

    def _failed(self, why: str) -> DidNotStart:
        tail = self.log.read_text(errors="replace").splitlines()[-15:] if self.log.exists() else []
        return DidNotStart("\n    ".join([f"{why}; see {self.log}", *tail]))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def info(self) -> dict[str, Any]:
        """``/info`` as a JSON object; RuntimeError when it does not answer 200 with one."""
        answer = get(self.port, "/info")
        info = answer.json() if answer.status_code == 200 else None
        if not isinstance(info, dict):
            raise RuntimeError(f"/info answered {answer.status_code}")
        return info

    def engine_stats(self) -> dict[str, Any]:
        """The engine's counters (``/info``'s ``stats``: batches, tokens, …); RuntimeError when /info does not
        answer 200 with a JSON object."""
        stats = self.info().get("stats", {})
        return stats if isinstance(stats, dict) else {}

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"name{labels}": value}``; empty when it does not answer 200."""
        answer = get(self.port, "/metrics")
        return parse_exposition(answer.text) if answer.status_code == 200 else {}

    def __enter__(self) -> ServiceProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RedisServer:
    """``redis-server`` on a loopback port (a free one unless given), nothing saved, stopped and started at
    will on that port."""

    def __init__(
        self, binary: str = "redis-server", max_memory_mb: int | None = None, port: int | None = None
    ) -> None:
        found = shutil.which(binary)
        if found is None:
            raise RuntimeError(f"{binary} not found (CI installs it: apt-get install redis-server)")
        self.port = port or free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        limits = ["--appendonly", "no"]
        if max_memory_mb is not None:  # bounded, evicting the oldest
            limits += ["--maxmemory", f"{max_memory_mb}mb", "--maxmemory-policy", "allkeys-lru"]
        self.command = [found, "--port", str(self.port), "--bind", HOST, "--save", "", *limits]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start it and wait until it answers PING. Returns itself.

        Raises:
            RuntimeError: it did not answer within ``timeout_s`` or exited.
        """
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return self
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL: no goodbye on its connections, the way a crashed or OOM-killed Redis goes."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2)
