"""What ``GET /info`` shows of a service: the model by its served name (never a path), variant and
provider, limits, batching settings, and the engine's and cache's counters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app import __version__

if TYPE_CHECKING:
    from app.service import Service


def describe(service: Service) -> dict[str, Any]:
    m = service.model.manifest
    s = service.settings
    return {
        "model_id": service.served_name,
        "revision": m.source.revision,
        "weights": m.source.weights,
        "variant": service.model.variant,
        "provider": service.model.providers[0],
        "providers": service.model.providers,
        "choice": service.model.reason,
        "num_layers": m.config.num_layers,
        "hidden_size": m.config.hidden_size,
        "has_pooler": service.model.has_pooler,
        "has_mlm_head": service.model.has_mlm_head,
        "max_input_length": m.tokenizer.max_length,
        "max_input_chars": s.max_input_chars,
        "max_inputs_per_request": s.max_inputs_per_request,
        "max_embed_all_tokens": s.max_embed_all_tokens,
        "batching": {
            "max_batch_tokens": s.max_batch_tokens,
            "max_batch_size": s.max_batch_size,
            "max_wait_ms": s.max_wait_ms,
            "max_concurrent_inputs": s.max_concurrent_inputs,
        },
        "ready": service.ready,
        "version": __version__,
        "stats": service.engine.stats(),
        "cache": service.cache.stats(),
    }
