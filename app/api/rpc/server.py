"""The gRPC server beside HTTP: same process, same event loop, same Service, same admission.

Started by the app's lifespan when ``ZHEMBED_GRPC_PORT`` is set (every worker binds the port with
SO_REUSEPORT, as gRPC does by default on Linux, so the kernel spreads connections over them). It serves
text-embeddings-inference's ``tei.v1`` services (:mod:`app.api.rpc.tei`), ``zhembed.v1``
(:mod:`app.api.rpc.ours`), ``grpc.health.v1`` (SERVING once the model is warm, NOT_SERVING while draining)
and server reflection. Requests larger than ``max_body_bytes`` are refused by gRPC itself
(RESOURCE_EXHAUSTED), and so is a call beyond ``grpc_max_concurrent_rpcs`` at once (each worker's bound:
what streams and calls waiting to be read or written hold); a request that is not a valid message (or carries a string that is not UTF-8) is
refused INVALID_ARGUMENT, saying what is wrong (:mod:`app.api.rpc.wire`). On SIGTERM the drain refuses new calls (UNAVAILABLE) and health turns
NOT_SERVING; at shutdown :meth:`Grpc.stop` lets the calls in flight finish within the grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from app.api.auth import ApiKeys
from app.api.drain import Drain
from app.api.rpc import ours, tei
from app.api.rpc.calls import Calls
from app.settings import Settings
from app.tasks.models import Models
from app.tasks.service import Service, fault_of
from app.telemetry.metrics import Metrics
from app.telemetry.observe import Observer

log = logging.getLogger(__name__)


class Grpc:
    def __init__(
        self,
        settings: Settings,
        service: Callable[[], Service | None],
        metrics: Metrics,
        drain: Drain,
        keys: ApiKeys | None,
        observer: Observer | None = None,
        models: Callable[[], Models | None] | None = None,
    ) -> None:
        """``service``: the (default) model's; ``models``: every model's, which a call's metadata
        ``model`` chooses from, and whose readiness health reports (None: ``service`` alone)."""
        self.settings = settings
        self._service = service
        self._models = models
        self.drain = drain
        limit = settings.max_body_bytes
        self.server = grpc.aio.server(
            maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1),
            ],
        )
        calls = Calls(service, metrics, drain, keys, observer, models)
        self.names = tei.add_to(self.server, calls) + ours.add_to(self.server, calls)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [
                *self.names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.port = 0
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind and serve; the port bound (the setting's, or a free one for port 0)."""
        address = f"{self.settings.host}:{self.settings.grpc_port}"
        self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"gRPC cannot listen on {address}")
        await self.server.start()
        self._watch = asyncio.create_task(self._health())
        log.info("gRPC on %s", address)
        return self.port

    async def _health(self) -> None:
        """Keep every service's health in step with readiness, the drain and the models' faults (NOT_SERVING
        once ``/health`` answers 503)."""
        current = None
        while True:
            service = self._service()
            models = self._models() if self._models is not None else None
            ready = models.ready if models is not None else service is not None and service.ready
            failed = fault_of(models.services if models is not None else [service] if service else [])
            serving = service is not None and ready and not self.drain.draining and failed is None
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if serving
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            if status != current:
                for name in ("", *self.names):
                    await self.health.set(name, status)
                current = status
            await asyncio.sleep(0.05)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, let those in flight finish for up to ``grace_s``, then close."""
        if self._watch is not None:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
