"""The service's settings for a benchmark, built from :class:`app.settings.Settings`: as the environment of
``python -m app`` (:func:`service_env`), or as the service itself in this process (:func:`in_process`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.settings import Settings

if TYPE_CHECKING:
    from app.engine.engine import Engine
    from app.tasks.service import Service

PREFIX = str(Settings.model_config.get("env_prefix", "ZHEMBED_"))
# The batch settings a GPU gets: a GPU batch costs little per token, so full batches are worth more than
# tight length groups (app/settings.py). ``--gpu-like`` runs a CPU service with them.
GPU_LIKE: dict[str, Any] = {"max_batch_size": 256, "max_batch_tokens": 32768, "batch_overhead_tokens": 1024}


def fields(model: Path, variant: str, admit: int, **more: Any) -> dict[str, Any]:
    """A benchmark's settings: cache off, quiet logs, and admission at ``admit`` inputs at least (512),
    above the load, so that no cell is answered 429; ``more`` adds or replaces any other setting.

    Raises:
        ValueError: a name in ``more`` is not a setting of this service.
    """
    unknown = sorted(set(more) - set(Settings.model_fields))
    if unknown:
        raise ValueError(f"not settings of app.settings.Settings: {unknown}")
    base = {"model": str(model), "variant": variant, "log_level": "warning", "cache_bytes": 0}
    return {**base, "max_concurrent_inputs": max(512, admit), **more}


def service_env(model: Path, variant: str, admit: int, **more: Any) -> dict[str, str]:
    """:func:`fields` as the environment of ``python -m app`` (``ZHEMBED_*``; a None is left out)."""
    values = fields(model, variant, admit, **more)
    return {f"{PREFIX}{k.upper()}": str(v) for k, v in values.items() if v is not None}


async def in_process(settings: Settings) -> tuple[Service, Engine]:
    """The service and engine as ``python -m app`` builds them, in this process, ready for calls; the
    caller stops the engine."""
    from app.cache.vectors import VectorCache
    from app.engine.engine import Engine
    from app.model.runtime import load_model
    from app.tasks.service import Service
    from app.telemetry.metrics import Metrics

    metrics = Metrics()
    engine = Engine(load_model(settings), settings, metrics)
    engine.start()
    await engine.wait_calibrated()  # the batch cost model, measured (or read) before the first batch
    service = Service(settings, engine.model, engine, VectorCache(None, None, metrics))
    service.ready = True
    return service, engine
