"""The HTTP server: uvicorn on uvloop and httptools, with a drain before its graceful shutdown.

Shutdown: the signal begins the drain (:mod:`app.api.drain`: readiness false, new requests 503,
accepted ones go on); after ``shutdown_drain_s`` the listener closes, the requests still in flight get
the rest of ``shutdown_grace_s`` to finish, the lifespan stops the engine, and the process exits 0.
A second signal stops waiting for the drain.

Retirement (a worker of several, on SIGUSR1 from its supervisor, once the worker replacing it is ready:
:mod:`app.serving.supervisor`): the worker closes its copy of the listening socket (the other workers
go on accepting on theirs), answers every request on the connections it holds, each response with
``Connection: close`` (:mod:`app.api.drain`), and shuts down as after a drain once it holds no
connection, or after ``shutdown_grace_s`` at most of waiting for them. Nothing is refused with 503.

Failure (a model whose warm-up failed, an inference thread that died:
:attr:`app.tasks.service.Service.fault`): the server stops as after a drain's end (the listener closes,
the requests in flight finish) and the process exits 1, so that what runs it starts another: the
supervisor for a worker of several (:mod:`app.serving.slots`), the orchestrator for a single process.
Until then ``/health`` answers 503 with why. A worker of several whose lifespan failed (its warm-up
raises there) exits 3 (uvicorn's own start-up failure), and is replaced alike.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.api.drain import Drain
from app.settings import Settings
from app.tasks.service import fault_of

log = logging.getLogger("app")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its own graceful shutdown.

    uvicorn alone closes the listener on SIGTERM at once, and after its shutdown re-raises the signal,
    so the process dies by it (exit 143) rather than exiting 0; this class does neither.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        drain_s: float,
        retire_s: float | None = None,
        on_retire: Callable[[], None] = lambda: None,
        fault: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``retire_s``: with it, SIGUSR1 retires this worker (see the module docstring), waiting this long
        at most for its connections; ``on_retire`` runs once when the retirement begins; ``fault``: why
        the app cannot serve any more (None: it can), read every tick (a tenth of a second)."""
        super().__init__(config)
        self.drain = drain
        self.drain_s = drain_s
        self.retire_s = retire_s
        self.on_retire = on_retire
        self.fault = fault
        self.failed: str | None = None  # the fault it stopped for
        self._announced = False
        self._retire_asked = False
        self._retiring_since: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.retire_s is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._ask_retire)

    def _ask_retire(self, sig: int, frame: FrameType | None) -> None:
        self._retire_asked = True  # a signal handler: a plain store; on_tick does the rest

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in a signal handler: only plain stores here, the logging happens in on_tick.
        if self.drain.draining:
            # A second signal skips the rest of the drain; a third Ctrl-C stops waiting for requests too.
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self.drain.begin()

    @property
    def exit_status(self) -> int:
        """What the process exits with once :meth:`run` returns: 1 when it stopped for a fault, or its
        start failed (the lifespan raised, the port could not be bound); else 0."""
        return 1 if self.failed is not None or not self.started else 0

    async def on_tick(self, counter: int) -> bool:
        if self.failed is None and (reason := self.fault()) is not None:
            self.failed = reason
            log.critical("stopping for a fault (%s): exit status 1, to be replaced", reason)
            self.should_exit = True
        if self.drain.draining and not self._announced:
            self._announced = True
            log.info(
                "draining: /ready and new requests answer 503 for %.1f s, then the listener closes",
                self.drain_s,
            )
        if self.drain.draining and self.drain.elapsed() >= self.drain_s:
            self.should_exit = True
        if self._retire_asked:
            self._retire()
        return await super().on_tick(counter)

    def _retire(self) -> None:
        connections = self.server_state.connections
        if self._retiring_since is None:
            self._retiring_since = time.monotonic()
            for server in self.servers:  # this process's copy of the listener; the others keep theirs
                server.close()
            self.drain.retire()
            self.on_retire()
            log.info(
                "retiring: the listener is closed; the %d connections held are served, each closed after "
                "its next response",
                len(connections),
            )
        if self.should_exit:
            return
        waited = time.monotonic() - self._retiring_since
        assert self.retire_s is not None  # (only asked for when set)
        if not connections:
            log.info("retired: no connection left after %.1f s", waited)
            self.should_exit = True
        elif waited >= self.retire_s:
            log.warning(
                "retired: %d connections still open after %.1f s are closed", len(connections), waited
            )
            self.should_exit = True


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
    worker = app.state.cluster is not None  # one of several, which its supervisor may retire
    return DrainingServer(
        config,
        app.state.drain,
        settings.shutdown_drain_s,
        retire_s=settings.shutdown_grace_s if worker else None,
        on_retire=lambda: app.state.metrics.ready(False),
        fault=lambda: fault_of(models.services) if (models := getattr(app.state, "models", None)) else None,
    )
