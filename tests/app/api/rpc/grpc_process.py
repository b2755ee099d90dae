"""``python -m app`` with gRPC on, in a process of its own, for the tests that call it over gRPC.

A process of its own: a client generated in a test from the project's protos defines the same protobuf
symbols as the server's generated modules, and the two cannot meet in one descriptor pool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from loadtest.server import free_port

KEY = "grpc-test-key"


class Server:
    def __init__(self, proc: subprocess.Popen[str], http: int, grpc_port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{http}"
        self.target = f"127.0.0.1:{grpc_port}"
        self.channel = grpc.insecure_channel(self.target)

    def output(self) -> str:
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        return self.proc.stdout.read()


def start_grpc_server(model: Path, module: str = "app", **env: str) -> Server:
    """``python -m module`` (``app``, or a test's wrapper of it) on ``model``, with ``env`` added."""
    http, rpc = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        env={
            **os.environ,
            "ZHEMBED_MODEL": str(model),
            "ZHEMBED_VARIANT": "fp32",
            "ZHEMBED_HOST": "127.0.0.1",
            "ZHEMBED_PORT": str(http),
            "ZHEMBED_GRPC_PORT": str(rpc),
            "ZHEMBED_INTRA_OP_THREADS": "1",
            "ZHEMBED_CACHE_BYTES": "0",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Server(proc, http, rpc)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"python -m app exited: {server.output()}"
        assert time.monotonic() < deadline, "python -m app did not get ready"
        try:
            headers = {"authorization": f"Bearer {KEY}"} if "ZHEMBED_API_KEYS" in env else {}
            if httpx.get(server.url + "/ready", headers=headers, timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop_grpc_server(server: Server) -> None:
    server.channel.close()
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.proc.kill()


def post(server: Server, path: str, body: dict[str, Any], status: int = 200) -> Any:
    """The JSON answer of an HTTP POST to ``server``, which must have ``status``."""
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    """The error a gRPC call must end with."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


def f32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)
