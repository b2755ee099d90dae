"""Cache keys: everything that changes a vector is in the key, so two option sets never collide and a new
model never serves an old vector.

``zhembed:v1:<model>:<options>:<text>`` where ``<model>`` is the start of the encoder graph's sha256 from
the manifest (plus the tokenizer's, folded in), ``<options>`` a digest of the resolved embedding options
(exactly :data:`OPTION_FIELDS`, checked) and ``<text>`` a digest of the input. The model part is in clear so an operator can drop one model's keys
with ``SCAN MATCH zhembed:v1:<model>:*``.
"""

from __future__ import annotations

import hashlib

import orjson

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


def model_digest(graph_sha256: str, tokenizer_sha256: str) -> str:
    """16 hex digits naming the exact graph file and tokenizer that compute the vectors."""
    return hashlib.sha256(f"{graph_sha256}:{tokenizer_sha256}".encode()).hexdigest()[:16]


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
