"""What ``GET /info`` shows of each model (by its served name, never a path) and which model answers each
route by default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app import __version__
from app.model.manifest import KIND_NAMES

if TYPE_CHECKING:
    from app.tasks.models import Models
    from app.tasks.service import Service


_MATRYOSHKA = (
    "config.json matryoshka_dimensions or is_matryoshka (as vLLM reads them), or python -m export "
    "--matryoshka-dimensions"
)

# Where each default comes from, by the kind of folder the model was exported from.
_SOURCES = {
    "bert": {
        "pooling": "zhembed's default for a BERT checkpoint",
        "normalize": "zhembed's default (TEI's)",
        "long_text": "zhembed's default (TEI's: refuse over-long inputs)",
        "max_input_length": "config.json max_position_embeddings",
        "prompt_name": "none (the model defines no prompts)",
        "matryoshka": _MATRYOSHKA,
    },
    "sentence-transformers": {
        "pooling": "the folder's Pooling module (its config.json)",
        "normalize": "modules.json (a Normalize module, or none)",
        "long_text": "sentence-transformers' encode, which truncates",
        "max_input_length": "sentence_bert_config.json max_seq_length",
        "prompt_name": "config_sentence_transformers.json default_prompt_name",
        "matryoshka": _MATRYOSHKA,
    },
}


def describe(service: Service) -> dict[str, Any]:
    m = service.model.manifest
    s = service.settings
    d = m.defaults
    o = service.defaults
    head = m.head
    labels = {str(k): v for k, v in head.labels.items()} if head is not None else None
    # TEI's model_type, which Dify's TEI provider reads to tell an embedder from a reranker (TEI serves no
    # tagger: that one is named for what it is).
    model_type: dict[str, Any] = {"embedding": {"pooling": o.pooling}}
    if head is not None and m.kind != "embedding":
        label2id = {v: k for k, v in head.labels.items()}
        model_type = {
            ("token_classifier" if m.kind == "tagger" else m.kind): {"id2label": labels, "label2id": label2id}
        }
    return {
        "model_id": service.served_name,
        "model_type": model_type,
        "kind": m.kind,
        "kind_description": KIND_NAMES[m.kind],
        "routes": service.routes(),
        "labels": labels,
        # The options a request gets for what it leaves out, and where each came from.
        "defaults": {
            "pooling": o.pooling,
            "normalize": o.normalize,
            "long_text": o.long_text,
            "max_input_length": service.model.tokenizer.max_length,
            "prompt_name": o.prompt_name,
            "prompts": d.prompts,
            "include_prompt": d.include_prompt,
            "do_lower_case": d.do_lower_case,
            "dense": [
                {"in": x.in_features, "out": x.out_features, "activation": x.activation} for x in d.dense
            ],
            "dimensions": service.embeddings.width,
            # Whether a request's dimensions may cut the vectors (else only the width above is taken), and to
            # which widths (None: any of 1..dimensions).
            "matryoshka": d.matryoshka,
            "matryoshka_dimensions": d.matryoshka_dimensions,
            "modules": d.modules,
            "source": d.source,
            "sources": _SOURCES[d.source],
        },
        "revision": m.source.revision,
        "weights": m.source.weights,
        "variant": service.model.variant,
        "provider": service.model.providers[0],
        "providers": service.model.providers,
        # ONNX Runtime's intra-op threads for its runs (0: every physical core); with several models, the
        # shared pool's (app/model/pool.py).
        "intra_op_threads": service.model.threads,
        "choice": service.model.reason,
        "architecture": m.config.architecture,
        "num_layers": m.config.num_layers,
        "hidden_size": m.config.hidden_size,
        "has_pooler": service.model.has_pooler,
        "has_mlm_head": service.model.has_mlm_head,
        # SPLADE's pooling and activation where the export has the sparse graph (/embed_sparse); else None.
        "sparse": m.sparse.model_dump() if service.model.has_sparse and m.sparse is not None else None,
        "max_input_length": m.tokenizer.max_length,
        "max_input_chars": s.max_input_chars,
        "max_inputs_per_request": s.max_inputs_per_request,
        "max_client_batch_size": s.max_inputs_per_request,  # TEI's name for it
        "max_embed_all_tokens": s.max_embed_all_tokens,
        "batching": {
            "max_batch_tokens": s.max_batch_tokens,
            "max_batch_size": s.max_batch_size,
            # size × longest² (0: none); the warm-up ran the largest batches it allows (issue 31).
            "max_batch_attention": service.engine.limits.attention,
            "largest_batches": [
                list(shape) for shape in service.engine.limits.largest(m.tokenizer.max_length)
            ],
            "max_wait_ms": s.max_wait_ms,
            "max_concurrent_inputs": s.max_concurrent_inputs,
            **service.engine.scheduling(),
            # Batches padded to a grid of shapes, warmed before /ready (app/model/shaped.py); None: exact.
            "shape_grid": service.model.shapes.describe() if service.model.shapes is not None else None,
        },
        "ready": service.ready,
        "version": __version__,
        "stats": service.engine.stats(),
        "cache": service.cache.stats(),
    }


def describe_all(models: Models) -> dict[str, Any]:
    """The default model's description, each model's under ``models``, and each route's default model."""
    default = models.services[0]
    routes = dict.fromkeys(r for service in models.services for r in service.routes())
    return {
        **describe(default),
        "models": [describe(service) for service in models.services],
        "default_models": {route: models.default(route).served_name for route in routes},
    }
