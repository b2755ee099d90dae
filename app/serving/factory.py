"""The application factory: settings in, FastAPI app out.

Start-up (the lifespan) loads the model unless one is given, starts the engine's threads and the cache's
Redis writer, and warms up (once the inference thread has measured, or read from its cache, what a batch
costs: :mod:`app.engine.costs`): a single process in the background, /health answering at once, /ready and
the data routes once warm-up is done; a worker of several before it accepts any connection on the
listening socket it shares, since a client cannot choose which worker accepts it.

Every HTTP request passes one chain of gates (:mod:`app.api.http.gates`): draining (after SIGTERM: 503,
see :mod:`app.api.drain`) → API keys (before the body is read) → urgency → body-size limit, and is counted.
POST on a data route runs it in one ASGI function in front of everything (:mod:`app.api.http.fast`), every
other request in one middleware in front of FastAPI.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app import __version__
from app.api.auth import OPS_PATHS, ApiKeys
from app.api.drain import Drain
from app.api.errors import install_error_handlers
from app.api.http.fast import DataPath, fast_routes
from app.api.http.gates import GateMiddleware, Gates
from app.api.http.openai_routes import router as openai_router
from app.api.http.retrieval_routes import router as retrieval_router
from app.api.http.routes import router
from app.cache.memory_tier import MemoryLRU
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.scheduler import Scheduler
from app.model.runtime import OnnxModel, load_models
from app.serving.cluster import Cluster
from app.serving.memory import memory_bytes
from app.settings import Settings, SettingsError
from app.tasks.models import Models
from app.tasks.service import Service
from app.telemetry.loop_lag import LoopLag
from app.telemetry.metrics import Metrics
from app.telemetry.observe import Observer
from app.telemetry.otel_config import from_environment

log = logging.getLogger(__name__)

REDIS_CLOSE_S = 5.0  # the most a stopping worker waits for its Redis client to close


def create_app(
    settings: Settings | None = None,
    model: OnnxModel | None = None,
    cluster: Cluster | None = None,
    models: Sequence[OnnxModel] | None = None,
) -> FastAPI:
    """The service as an ASGI app: one model, or several (``settings.models``) sharing one process.

    Args:
        settings: the frozen settings; ``Settings()`` (environment only) when omitted.
        model: an already loaded model (``python -m app`` loads it first to fail fast); loaded in the
            lifespan when omitted.
        cluster: the server this app is one worker of (:mod:`app.serving.cluster`); None for a single process.
        models: every model already loaded, in the order of ``settings.model_entries()`` (for several).

    Raises:
        SettingsError: the API keys setting cannot be used (checked here, before anything serves).
    """
    settings = settings or Settings()
    served_entries = settings.model_entries()
    names = [name for name, _ in served_entries if name is not None]
    metrics = Metrics(cluster.shared.metrics_dir if cluster is not None else None, names)
    entries = settings.api_key_entries()
    keys = ApiKeys.from_entries(entries) if entries else None
    try:  # the standard OTEL_* variables: off unless they name a collector
        tracing = from_environment(os.environ)
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    observer = Observer(tracing, settings.log_format == "json")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if models is not None:
            loaded = list(models)
        elif model is not None:
            loaded = [model]
        else:
            loaded = await asyncio.to_thread(load_models, settings)
        # Several models share one inference thread, express threads for short batches, and ONNX
        # Runtime's one thread pool (load_models).
        scheduler = None
        if len(served_entries) > 1:
            scheduler = Scheduler(
                trim_every=settings.memory_trim_batches, express_share=settings.express_share
            )
        tiers = _build_cache(settings, metrics)  # one LRU and one Redis for all: keys differ by model
        services = []
        for index, ((name, own), onnx) in enumerate(zip(served_entries, loaded, strict=True)):
            view = metrics.for_model(name) if name is not None else metrics
            # The server's shared ledger once warm (_warm): a warm-up never waits on, or is refused by,
            # the traffic the other workers hold.
            engine = Engine(onnx, own, view, tracing, scheduler)
            engine.start()
            services.append(Service(own, onnx, engine, VectorCache(tiers.memory, tiers.shared, view)))
            metrics.set_model(
                services[-1].served_name,
                onnx.variant,
                onnx.providers[0],
                onnx.manifest.source.weights,
                index == 0,
            )
            if index:
                view.watch_queue(engine.batcher.depth_of)
        if scheduler is not None:
            scheduler.start()
        service = services[0]
        served = Models(services, named=settings.models is not None)
        metrics.watch(
            queue_depth=service.engine.batcher.depth_of,
            in_flight=lambda: sum(s.engine.admission.in_use for s in services),
            cache_bytes=lambda: tiers.memory.bytes if tiers.memory is not None else 0,
            memory_bytes=cluster.memory_bytes if cluster is not None else _own_memory,
        )
        app.state.service = service
        app.state.models = served
        lag = LoopLag(metrics.loop_lag.observe).start()  # this worker's loop, for as long as it serves
        rpc = None
        if settings.grpc_port is not None:
            from app.api.rpc.server import Grpc  # here: grpc costs its import only when gRPC is on

            rpc = Grpc(settings, lambda: service, metrics, drain, keys, observer, lambda: served)
            await rpc.start()
        # A worker shares its listening socket with the others: it warms up before the server starts to
        # accept on it, so no connection lands on a worker that would answer 503 while the rest serve. A
        # single process accepts at once: /health answers, /ready says when it is warm.
        warm = None
        if cluster is not None:
            await _warm(served, settings.warmup, metrics, cluster)
        else:
            warm = asyncio.create_task(_warm(served, settings.warmup, metrics, cluster))
        pushing = asyncio.create_task(_push_gauges(metrics)) if cluster is not None else None
        try:
            yield
        finally:
            lag.cancel()
            if warm is not None:
                warm.cancel()
            if rpc is not None:  # the calls in flight finish within what is left of the grace period
                await rpc.stop(max(settings.shutdown_grace_s - settings.shutdown_drain_s, 1.0))
            if pushing is not None:
                pushing.cancel()
            if cluster is not None:
                cluster.set_ready(False)
            if tiers.shared is not None:  # bounded: a stop must not wait on a Redis that does not answer
                try:
                    await asyncio.wait_for(tiers.shared.aclose(), REDIS_CLOSE_S)
                except TimeoutError:
                    log.warning("the Redis client did not close within %.0f s; left as it is", REDIS_CLOSE_S)
            for each in services:
                each.engine.stop()
            if scheduler is not None:
                scheduler.stop()
            await asyncio.to_thread(tracing.shutdown)  # what is queued goes out, within seconds

    app = FastAPI(
        title="zhembed",
        version=__version__,
        description="Embeddings, similarity and fill-mask for Chinese BERT on ONNX Runtime.",
        lifespan=lifespan,
        **_without_native_telemetry(),
    )
    app.state.metrics = metrics
    app.state.cluster = cluster
    app.state.tracing = tracing
    # Begun by `python -m app` on SIGTERM; the gates read it on every request.
    app.state.drain = drain = Drain()
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(openai_router)
    app.include_router(retrieval_router)
    gates = Gates(
        metrics=metrics, drain=drain, keys=keys, max_body_bytes=settings.max_body_bytes, observer=observer
    )
    routers = (router, openai_router, retrieval_router)
    routes = frozenset(r.path for rt in routers for r in rt.routes if isinstance(r, APIRoute))
    open_paths = frozenset() if settings.auth_ops_routes else OPS_PATHS
    app.add_middleware(GateMiddleware, gates=gates, routes=routes | OPS_PATHS, open_paths=open_paths)
    # POST on a data route: the same gates in one function in front of all of it, Starlette's error
    # middleware included (app.api.http.fast). Built now, so Starlette refuses any middleware added later
    # (it could not be in front); the stack above serves every other request, and on its own would serve
    # these the same.
    app.middleware_stack = DataPath(
        app.build_middleware_stack(), fast_routes(*routers), state=app.state, gates=gates
    )
    return app


def _without_native_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry hooks, off where this FastAPI has them (its ``telemetry`` argument).

    When on, they ask OpenTelemetry's global providers on every request whether anyone listens, a cost
    per request on the event loop (docs/performance.md). zhembed's telemetry is its Prometheus
    ``/metrics`` and :mod:`app.telemetry`.
    """
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def _build_cache(settings: Settings, metrics: Metrics) -> VectorCache:
    """The cache's tiers (each model reads them through a :class:`VectorCache` of its own)."""
    memory = MemoryLRU(settings.cache_bytes) if settings.cache_bytes > 0 else None
    shared = None
    if settings.redis_url is not None:
        from app.cache.redis_tier import RedisTier  # here: redis-py costs 6 MB resident, unused without Redis

        shared = RedisTier(
            settings.redis_url.get_secret_value(),
            ttl_s=settings.cache_ttl_s,
            timeout_s=settings.redis_timeout_ms / 1000,
            max_backoff_s=settings.redis_max_backoff_s,
            metrics=metrics,
        )
        shared.start()
    return VectorCache(memory, shared, metrics)


async def _warm(served: Models, warmup: bool, metrics: Metrics, cluster: Cluster | None) -> None:
    """Warm every model (one after the other: they share the inference thread), then mark them ready
    together: no model answers before every one can.

    A warm-up that fails (say, out of memory on the largest batch) is no worker: the model records why
    (``/health`` answers 503 with it), and the process stops, with a non-zero exit status, to be
    replaced: a worker of several before it accepts a connection (this raises, its lifespan fails and
    uvicorn exits 3), a single process with exit status 1 once its server sees the fault
    (:mod:`app.serving.server`)."""
    for index, service in enumerate(served.services):
        try:
            await service.engine.wait_calibrated()  # the batch cost model: measured once, then cached
            if warmup:
                await service.warmup()
            if cluster is not None:
                service.engine.admission.join(cluster.ledger_for(index))
        except Exception as exc:
            service.warmup_failed(exc)
            log.critical("%s: this process cannot serve; it stops, to be replaced", service.fault)
            if cluster is not None:
                raise
            return
    _quiet_gc()
    for service in served.services:
        service.ready = True
    metrics.ready(True)
    if cluster is not None:
        if cluster.replacing is not None:  # counted here: a replacement that dies starting is not one
            metrics.worker_replaced(cluster.replacing)
        cluster.set_ready(True)  # after the count: the supervisor retires the worker replaced on it
    if served.named:  # which models, in order (the first is the default)
        log.info("ready: %s", ", ".join(served.names))
    else:
        log.info("ready")


def _own_memory() -> float:
    """This process's memory (one process: no supervisor measures it)."""
    return float(memory_bytes(os.getpid()) or 0)


# Allocations between young-generation collections (CPython's default is 700). A request allocates a few
# hundred objects, almost all freed by reference counting; at 700 the collector would run every request
# or two (docs/performance.md has the measurement).
GC_YOUNG_THRESHOLD = 50_000


def _quiet_gc() -> None:
    """Move what start-up built (the model, the app, their modules) out of the collector's sight and
    collect the young generation less often, so the cyclic collector does not scan long-lived objects
    that never become garbage. Per process: each worker calls it once it is warm."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def _push_gauges(metrics: Metrics) -> None:
    """With several workers, gauges are pushed (see :meth:`Metrics.refresh`): twice a second."""
    while True:
        metrics.refresh()
        await asyncio.sleep(0.5)
