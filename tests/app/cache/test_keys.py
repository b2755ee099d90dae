"""Cache keys: everything that changes a vector is in the key."""

from __future__ import annotations

import dataclasses

import pytest

from app.cache.keys import NAMESPACE, OPTION_FIELDS, key, model_digest, space
from app.tasks.options import EmbedOptions

OPTIONS: dict[str, object] = {
    "pooling": "mean",
    "layers": [3],
    "layer_combine": "concat",
    "layer_weights": None,
    "normalize": True,
    "long_text": "error",
    "truncation_direction": "right",
    "input": "text",
    "prompt": None,
    "output": "vector",
}


def test_every_option_and_the_model_change_the_key() -> None:
    model = model_digest("a" * 64, "b" * 64)
    base = key(space(model, OPTIONS), "你好")
    variants = [
        {**OPTIONS, "pooling": "cls"},
        {**OPTIONS, "layers": [2]},
        {**OPTIONS, "layers": [2, 3]},
        {**OPTIONS, "layer_combine": "mean"},
        {**OPTIONS, "layers": [2, 3], "layer_combine": "difference"},
        {**OPTIONS, "layers": [3, 2], "layer_combine": "difference"},
        {**OPTIONS, "layers": [2, 3], "layer_combine": "weighted", "layer_weights": [0.25, 0.75]},
        {**OPTIONS, "layers": [2, 3], "layer_combine": "weighted", "layer_weights": [0.75, 0.25]},
        {**OPTIONS, "normalize": False},
        {**OPTIONS, "long_text": "truncate"},
        {**OPTIONS, "truncation_direction": "left"},
        {**OPTIONS, "input": "token_ids"},
        {**OPTIONS, "prompt": "query"},
        {**OPTIONS, "output": "head_logits"},
    ]
    keys = {base, *(key(space(model, v), "你好") for v in variants)}
    keys.add(key(space(model_digest("c" * 64, "b" * 64), OPTIONS), "你好"))  # another graph
    keys.add(key(space(model_digest("a" * 64, "d" * 64), OPTIONS), "你好"))  # another tokenizer
    keys.add(key(space(model, OPTIONS), "你好!"))
    assert len(keys) == len(variants) + 4


def test_keys_are_stable_namespaced_and_name_the_model() -> None:
    model = model_digest("a" * 64, "b" * 64)
    shuffled = dict(reversed(list(OPTIONS.items())))
    assert key(space(model, OPTIONS), "文本") == key(space(model, shuffled), "文本")
    assert key(space(model, OPTIONS), "文本").startswith(f"{NAMESPACE}:{model}:")


def test_the_key_covers_every_embed_option() -> None:
    # and what the "text" is (a text, or token ids written out), the prompt by name, and what is cached
    # (a vector, or a head's logits); all but dimensions, which cuts the whole vector the cache keeps
    embed = {f.name for f in dataclasses.fields(EmbedOptions)} - {"prompt_name", "dimensions"}
    assert embed | {"input", "prompt", "output"} == OPTION_FIELDS


@pytest.mark.parametrize(
    "options",
    [
        {k: v for k, v in OPTIONS.items() if k != "layer_weights"},
        {**OPTIONS, "pooling_v2": "cls"},
    ],
)
def test_a_key_without_every_option_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="OPTION_FIELDS"):
        space(model_digest("a" * 64, "b" * 64), options)
