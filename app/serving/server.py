"""The HTTP server: uvicorn on uvloop and httptools, with a drain before its graceful shutdown.

Shutdown: the signal begins the drain (:mod:`app.api.drain`: readiness false, new requests 503,
accepted ones go on); after ``shutdown_drain_s`` the listener closes, the requests still in flight get
the rest of ``shutdown_grace_s`` to finish, the lifespan stops the engine, and the process exits 0.
A second signal stops waiting for the drain.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.api.drain import Drain
from app.settings import Settings

log = logging.getLogger("app")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its own graceful shutdown.

    uvicorn alone closes the listener on SIGTERM at once, and after its shutdown re-raises the signal,
    so the process dies by it (exit 143) rather than exiting 0; this class does neither.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_s = drain_s
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in a signal handler: only plain stores here, the logging happens in on_tick.
        if self.drain.draining:
            # A second signal skips the rest of the drain; a third Ctrl-C stops waiting for requests too.
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self.drain.begin()

    async def on_tick(self, counter: int) -> bool:
        if self.drain.draining and not self._announced:
            self._announced = True
            log.info(
                "draining: /ready and new requests answer 503 for %.1f s, then the listener closes",
                self.drain_s,
            )
        if self.drain.draining and self.drain.elapsed() >= self.drain_s:
            self.should_exit = True
        return await super().on_tick(counter)


def http_server(app: FastAPI, settings: Settings) -> DrainingServer:
    """The server for ``app`` as the settings configure it (``run()`` it, or ``run(sockets=...)``)."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
        # Nothing here reads the client's address, and rewriting it from X-Forwarded-For cost 2.6% of the
        # event loop under load (py-spy, 64 clients × 32 texts).
        proxy_headers=False,
        timeout_keep_alive=settings.keep_alive_s,
        # What is left of the grace period once the drain is over: the requests in flight get that long.
        timeout_graceful_shutdown=max(int(settings.shutdown_grace_s - settings.shutdown_drain_s), 1),
    )
    return DrainingServer(config, app.state.drain, settings.shutdown_drain_s)
