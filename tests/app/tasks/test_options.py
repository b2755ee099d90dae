"""Request options: layer resolution, layer mixes and dimensions."""

from __future__ import annotations

import re

import pytest

from app.errors import Unsupported, ValidationFailed
from app.model.manifest import Defaults
from app.tasks.options import (
    EmbedAllOptions,
    EmbedOptions,
    LayerCombine,
    check_dimensions,
    layer_mix,
    resolve_embed,
    resolve_embed_all,
    resolve_layers,
)


def test_weights_are_scaled_without_overflow() -> None:
    assert layer_mix("weighted", 2, (1e308, 1e308)).weights == (0.5, 0.5)
    assert layer_mix("weighted", 2, (0.0, 3.0)).weights == (0.0, 1.0)


@pytest.mark.parametrize(
    ("how", "layers", "weights", "words"),
    [
        ("weighted", 2, None, "needs layer_weights"),
        ("weighted", 2, (1.0,), "1 weights for 2 layers"),
        ("weighted", 2, (1.0, -1.0), "layer_weights[1] is -1.0"),
        ("weighted", 2, (float("nan"), 1.0), "layer_weights[0] is nan"),
        ("weighted", 2, (float("inf"), 1.0), "layer_weights[0] is inf"),
        ("weighted", 2, (0.0, 0.0), "all 0"),
        ("mean", 2, (1.0, 1.0), "'weighted' only"),
        ("difference", 3, None, "got 3"),
        ("difference", 1, None, "got 1"),
    ],
)
def test_layer_mix_refuses_what_does_not_fit(
    how: LayerCombine, layers: int, weights: tuple[float, ...] | None, words: str
) -> None:
    with pytest.raises(ValidationFailed, match=re.escape(words)):
        layer_mix(how, layers, weights)


def test_layers_resolve_to_one_based_from_either_end() -> None:
    assert resolve_layers(None, 12) == (12,)
    assert resolve_layers((6, -1, -12), 12) == (6, 12, 1)
    for bad, words in [
        ((), "empty"),
        ((13,), "out of range"),
        ((0,), "out of range"),
        ((1,) * 13, "at most 12"),
    ]:
        with pytest.raises(ValidationFailed, match=words):
            resolve_layers(bad, 12)


@pytest.mark.parametrize(
    ("layers", "words"),
    [
        ((4, 4), "layer 4 as 4, 4"),
        ((-1, 12), "layer 12 as -1, 12"),
        ((1, 2, -11, 3), "layer 2 as 2, -11"),
    ],
)
def test_a_layer_named_twice_is_refused_naming_it(layers: tuple[int, ...], words: str) -> None:
    with pytest.raises(ValidationFailed, match=re.escape(words)):
        resolve_layers(layers, 12)


def test_every_route_that_takes_layers_refuses_a_layer_named_twice() -> None:
    with pytest.raises(ValidationFailed, match="more than once"):
        resolve_embed(EmbedOptions(layers=(2, -2), layer_combine="mean"), 3, has_pooler=True)
    with pytest.raises(ValidationFailed, match="more than once"):
        resolve_embed_all(EmbedAllOptions(layers=(3, -1), layer_combine="mean"), 3)


def test_pooler_reads_the_last_layer_of_a_model_that_has_one() -> None:
    assert resolve_embed(EmbedOptions(pooling="pooler"), 3, has_pooler=True).layers == (3,)
    assert resolve_embed(EmbedOptions(pooling="pooler", layers=(-1,)), 3, has_pooler=True).layers == (3,)
    with pytest.raises(Unsupported, match="no pooler"):
        resolve_embed(EmbedOptions(pooling="pooler"), 3, has_pooler=False)
    with pytest.raises(ValidationFailed, match="last layer only"):
        resolve_embed(EmbedOptions(pooling="pooler", layers=(1,)), 3, has_pooler=True)


def test_resolution_checks_the_mix_against_the_layers() -> None:
    resolved = resolve_embed(
        EmbedOptions(layers=(1, 2), layer_combine="weighted", layer_weights=(1, 3)), 3, True
    )
    assert resolved.layers == (1, 2) and resolved.mix.weights == (0.25, 0.75)
    with pytest.raises(ValidationFailed, match="exactly two layers"):
        resolve_embed_all(EmbedAllOptions(layers=(1,), layer_combine="difference"), 3)


PLAIN = Defaults()
ANY = Defaults(matryoshka=True)
LISTED = Defaults(matryoshka=True, matryoshka_dimensions=[64, 32, 16])


@pytest.mark.parametrize("model", [PLAIN, ANY, LISTED])
def test_no_dimensions_and_the_whole_width_are_taken_from_every_model(model: Defaults) -> None:
    check_dimensions(None, 64, model)
    check_dimensions(64, 64, model)  # nothing is cut: what a client that sends the width expects


@pytest.mark.parametrize("dimensions", [0, -3, 16, 63, 65, 10**30])
def test_a_model_not_trained_for_shorter_vectors_refuses_any_other_width(dimensions: int) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_dimensions(dimensions, 64, PLAIN)
    message = refused.value.message
    assert message.startswith(f"dimensions {dimensions} is not supported: the vectors have 64 dimensions")
    assert "not trained for shorter ones (Matryoshka)" in message  # why
    assert (
        "leave dimensions out, or send 64" in message and "--matryoshka-dimensions" in message
    )  # what to do


def test_a_matryoshka_model_takes_any_width_up_to_its_own() -> None:
    for dimensions in (1, 16, 20, 63):
        check_dimensions(dimensions, 64, ANY)
    for dimensions in (0, -1, 65):
        with pytest.raises(
            ValidationFailed, match=rf"dimensions {dimensions} is out of range: .* send 1\.\.64"
        ):
            check_dimensions(dimensions, 64, ANY)


def test_a_model_that_lists_its_widths_takes_those_only() -> None:
    for dimensions in (16, 32):
        check_dimensions(dimensions, 64, LISTED)
    with pytest.raises(ValidationFailed) as refused:
        check_dimensions(20, 64, LISTED)
    assert (
        refused.value.message == "dimensions 20 is not one this model was trained for: send one of 64, 32, 16"
    )
    with pytest.raises(ValidationFailed, match="out of range"):
        check_dimensions(65, 64, LISTED)


def test_dimensions_are_checked_against_the_width_of_the_vectors_asked_for() -> None:
    # Two layers side by side: 128 wide; the model's own 64 would cut them, so it is a cut like any other.
    check_dimensions(128, 128, PLAIN)
    with pytest.raises(ValidationFailed, match="the vectors have 128 dimensions"):
        check_dimensions(64, 128, PLAIN)
