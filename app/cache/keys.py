"""Cache keys: everything that changes a vector is in the key, so two option sets never collide and a new
model never serves an old vector.

``zhembed:v1:<model>:<options>:<text>`` where ``<model>`` is a digest of every graph and tokenizer
setting of the variant served (:func:`model_digest`), ``<options>`` a digest of the resolved embedding options
(exactly :data:`OPTION_FIELDS`, checked) and ``<text>`` a digest of the input. The model part is in clear so an operator can drop one model's keys
with ``SCAN MATCH zhembed:v1:<model>:*``.
"""

from __future__ import annotations

import hashlib

import orjson

from app.model.manifest import Manifest

NAMESPACE = "zhembed:v1"

# Every option that changes an /embed vector, resolved (layers 1-based, weights scaled to sum 1). A key
# built from any other set of fields is refused, so an option added later cannot be left out silently.
# All but ``dimensions``: the cache keeps whole vectors, and the first components are cut after it.
OPTION_FIELDS = frozenset(
    {
        "pooling",
        "layers",
        "layer_combine",
        "layer_weights",
        "normalize",
        "long_text",
        "truncation_direction",
        "input",  # "text", or "token_ids" written out as text ("101,102" is not the text "101,102")
        "prompt",  # the prompt's name: the texts carry its text, the name says how it was pooled
        "output",  # "vector" (/embed) or "head_logits" (/predict, /rerank: the other fields are None)
    }
)


def model_digest(manifest: Manifest, variant: str) -> str:
    """16 hex digits naming everything of the export served that changes an answer.

    The sha256 of each graph of ``variant`` (the encoder, with a fine-tuned head inside it; the
    masked-LM head; the sparse graph), the tokenizer's files and settings (``max_length`` decides where
    a text is cut, ``do_lower_case`` what it reads), the serving defaults (the prompts and whether they
    are pooled, the Dense modules after the pooling), the head's labels and activation, the sparse
    pooling, and which output holds which layer. Not when or how fast it was exported, nor its validation
    figures: two exports of the same source with the same options name the same vectors.
    """
    identity = {
        "variant": variant,
        "graphs": {
            name: files[variant].sha256 for name, files in manifest.graphs.items() if variant in files
        },
        "tokenizer": manifest.tokenizer.model_dump(mode="json"),
        "defaults": manifest.defaults.model_dump(mode="json"),
        "extra_files": manifest.extra_files,  # the Dense modules' weights
        "head": manifest.head.model_dump(mode="json") if manifest.head is not None else None,
        "sparse": manifest.sparse.model_dump(mode="json") if manifest.sparse is not None else None,
        "config": manifest.config.model_dump(mode="json"),
        "layer_outputs": manifest.layer_outputs,
        "pooled_outputs": manifest.pooled_outputs,
    }
    return hashlib.sha256(
        orjson.dumps(identity, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    ).hexdigest()[:16]


def space(model: str, options: dict[str, object]) -> str:
    """The key prefix shared by every input embedded by ``model`` with ``options`` (resolved values).

    Raises:
        ValueError: ``options`` does not name exactly :data:`OPTION_FIELDS` (a bug, not an input).
    """
    if options.keys() != OPTION_FIELDS:
        missing, unknown = sorted(OPTION_FIELDS - options.keys()), sorted(options.keys() - OPTION_FIELDS)
        raise ValueError(
            f"cache key options do not match OPTION_FIELDS: missing {missing}, unknown {unknown}"
        )
    canonical = orjson.dumps(options, option=orjson.OPT_SORT_KEYS)
    return f"{NAMESPACE}:{model}:{hashlib.sha256(canonical).hexdigest()[:16]}:"


def key(prefix: str, text: str) -> str:
    """The key of ``text`` under ``prefix``: 128 bits of BLAKE2b, ample against accidental collisions."""
    return prefix + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
