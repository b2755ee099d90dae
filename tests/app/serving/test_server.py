"""The HTTP server (:mod:`app.serving.server`): one whose app can no longer serve stops with exit status 1,
so that what runs it starts another (graceful shutdown itself is tested in test_shutdown.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from fastapi import FastAPI

from app.api.drain import Drain
from app.serving.server import http_server
from app.settings import Settings
from loadtest.server import free_port
from tests.app.conftest import wait_until


def test_a_server_whose_model_reports_a_fault_stops_with_exit_status_1() -> None:
    app = FastAPI()
    app.state.drain = Drain()
    app.state.cluster = None  # one process, as create_app leaves it
    model = SimpleNamespace(fault=None)  # what the server reads of each served model (Service.fault)
    app.state.models = SimpleNamespace(services=[model])
    server = http_server(app, Settings(host="127.0.0.1", port=free_port()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started)
        assert thread.is_alive() and server.exit_status == 0
        model.fault = "the inference thread stopped: Killed"
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert server.exit_status == 1 and server.failed == "the inference thread stopped: Killed"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
