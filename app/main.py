"""The application factory: settings in, FastAPI app out.

Start-up (the lifespan) loads the model unless one is given, starts the engine's threads and warms up
in the background: /health answers at once, /ready and the data routes once warm-up is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.api.body_limit import BodyLimitMiddleware
from app.api.routes import router
from app.engine.engine import Engine
from app.errors import install_error_handlers
from app.model.runtime import OnnxModel, load_model
from app.service import Service
from app.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, model: OnnxModel | None = None) -> FastAPI:
    """The service as an ASGI app.

    Args:
        settings: the frozen settings; ``Settings()`` (environment only) when omitted.
        model: an already loaded model (``python -m app`` loads it first to fail fast); loaded in the
            lifespan when omitted.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = model if model is not None else await asyncio.to_thread(load_model, settings)
        engine = Engine(loaded, settings)
        engine.start()
        service = Service(settings, loaded, engine)
        app.state.service = service
        warm = asyncio.create_task(_warm(service, settings.warmup))
        try:
            yield
        finally:
            warm.cancel()
            engine.stop()

    app = FastAPI(
        title="zhembed",
        version=__version__,
        description="Embeddings, similarity and fill-mask for Chinese BERT on ONNX Runtime.",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(router)
    return app


async def _warm(service: Service, warmup: bool) -> None:
    if warmup:
        await service.warmup()
    service.ready = True
    log.info("ready")
