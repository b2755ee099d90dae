"""Cache keys: everything that changes a vector is in the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.cache.keys import NAMESPACE, OPTION_FIELDS, key, model_digest, space
from app.model.manifest import DenseLayer, GraphFile, Head, Manifest, Sparse, Variant, load_manifest
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


# Two model digests, as two exports would give them (the tests of model_digest are below).
MODEL, OTHER_GRAPH, OTHER_TOKENIZER = "0123456789abcdef", "1123456789abcdef", "2123456789abcdef"


def test_every_option_and_the_model_change_the_key() -> None:
    model = MODEL
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
    keys.add(key(space(OTHER_GRAPH, OPTIONS), "你好"))  # another graph
    keys.add(key(space(OTHER_TOKENIZER, OPTIONS), "你好"))  # another tokenizer
    keys.add(key(space(model, OPTIONS), "你好!"))
    assert len(keys) == len(variants) + 4


def test_keys_are_stable_namespaced_and_name_the_model() -> None:
    model = MODEL
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
        space(MODEL, options)


# --- the model digest --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparse_manifest(tiny_sparse_dir: Path) -> Manifest:
    """An export with every graph: the encoder, the masked-LM head and the sparse graph."""
    manifest = load_manifest(tiny_sparse_dir)
    assert {"encoder", "mlm_head", "sparse"} <= manifest.graphs.keys()
    return manifest


def test_two_exports_of_the_same_source_and_options_have_one_digest(
    tiny_source_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from export.pipeline import ExportOptions, run_export

    again = tmp_path / "model"
    run_export(ExportOptions(out=again, model=str(tiny_source_dir)), log=lambda _line: None)
    first, second = load_manifest(tiny_model_dir), load_manifest(again)
    assert first.created_at != second.created_at or first.timings_s != second.timings_s
    assert model_digest(first, "fp32") == model_digest(second, "fp32")


def _graph(manifest: Manifest, name: str, variant: Variant = "fp32") -> dict[str, dict[Variant, GraphFile]]:
    """The manifest's graphs with ``name``'s ``variant`` of another sha256 (another file)."""
    graphs: dict[str, dict[Variant, GraphFile]] = {g: dict(files) for g, files in manifest.graphs.items()}
    graphs[name][variant] = graphs[name][variant].model_copy(update={"sha256": "f" * 64})
    return graphs


def _changes(m: Manifest) -> dict[str, dict[str, Any]]:
    """One change each that alters what the service answers, as a manifest update."""
    t, d = m.tokenizer, m.defaults
    dense = DenseLayer(weight="0_Dense/w.npy", bias=None, in_features=32, out_features=16, activation="tanh")
    return {
        "encoder graph": {"graphs": _graph(m, "encoder")},
        "masked-LM graph": {"graphs": _graph(m, "mlm_head")},
        "sparse graph": {"graphs": _graph(m, "sparse")},
        "tokenizer file": {"tokenizer": t.model_copy(update={"files": {**t.files, "vocab.txt": "e" * 64}})},
        "max_length": {"tokenizer": t.model_copy(update={"max_length": t.max_length // 2})},
        "tokenizer do_lower_case": {"tokenizer": t.model_copy(update={"do_lower_case": not t.do_lower_case})},
        "defaults do_lower_case": {"defaults": d.model_copy(update={"do_lower_case": not d.do_lower_case})},
        "prompts": {"defaults": d.model_copy(update={"prompts": {"query": "查询："}})},
        "include_prompt": {"defaults": d.model_copy(update={"include_prompt": not d.include_prompt})},
        "Dense module": {"defaults": d.model_copy(update={"dense": [dense]})},
        "Dense weights": {"extra_files": {**m.extra_files, "0_Dense/w.npy": "d" * 64}},
        "sparse pooling": {"sparse": Sparse(pooling="sum")},
        "head": {
            "head": Head(
                architecture="BertForSequenceClassification",
                labels={0: "a"},
                problem_type=None,
                activation="softmax",
            )
        },
    }


@pytest.mark.parametrize(
    "change",
    [
        "encoder graph",
        "masked-LM graph",
        "sparse graph",
        "tokenizer file",
        "max_length",
        "tokenizer do_lower_case",
        "defaults do_lower_case",
        "prompts",
        "include_prompt",
        "Dense module",
        "Dense weights",
        "sparse pooling",
        "head",
    ],
)
def test_each_setting_that_changes_an_answer_changes_the_digest(
    sparse_manifest: Manifest, change: str
) -> None:
    changed = sparse_manifest.model_copy(update=_changes(sparse_manifest)[change])
    assert model_digest(changed, "fp32") != model_digest(sparse_manifest, "fp32")


def test_the_digest_names_the_variant_served_only(sparse_manifest: Manifest) -> None:
    assert model_digest(sparse_manifest, "fp32") != model_digest(sparse_manifest, "int8")
    # Another variant's graph file is not this one's: the fp32 digest stays.
    other = sparse_manifest.model_copy(update={"graphs": _graph(sparse_manifest, "mlm_head", "int8")})
    assert model_digest(other, "fp32") == model_digest(sparse_manifest, "fp32")
