"""Request options: each vocabulary declared once, the option objects, and their validation.

The API schemas reuse these ``Literal`` types for their fields, the service receives the frozen option
objects, and the checks that need the model (how many layers it has, whether it has a pooler) live
here too, so the meaning of an option is in one module. The pooling vocabulary is the exception: it is
declared beside its functions in :mod:`app.engine.pooling`, so a new mode is one module's change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.engine.pooling import POOLER, Pooling
from app.errors import Unsupported, ValidationFailed
from app.model.manifest import Defaults

__all__ = ["Pooling"]  # declared with its functions in app.engine.pooling; reused from here

# How several layers combine into one vector: side by side, their mean, a weighted sum, or a - b.
LayerCombine = Literal["concat", "mean", "weighted", "difference"]
# What happens to an input over the model's length: 422, keep one window, or average several windows.
LongText = Literal["error", "truncate", "chunk"]
# Which end truncation keeps: "right" keeps the start of the text.
Direction = Literal["right", "left"]
# How a vector is written on the wire (app/api/encoding.py); token vectors (/embed_all) know the first two,
# OpenAI's ``encoding_format`` the first two and the bit-packed pair.
Encoding = Literal["float", "base64", "int8", "binary", "ubinary"]
FloatEncoding = Literal["float", "base64"]
OpenAIEncoding = Literal["float", "base64", "binary", "ubinary"]


@dataclass(frozen=True)
class EmbedOptions:
    """What /embed, /similarity and the OpenAI route compute for each input.

    These defaults are a plain BERT's; a model's own (:func:`model_defaults`) replace them for every
    option a request leaves out.
    """

    pooling: Pooling = "mean"
    layers: tuple[int, ...] | None = None  # as requested: 1-based, negatives from the end; None = last
    layer_combine: LayerCombine = "concat"
    layer_weights: tuple[float, ...] | None = None  # layer_combine "weighted": one per layer, as sent
    long_text: LongText = "error"
    truncation_direction: Direction = "right"
    normalize: bool = True
    prompt_name: str | None = None  # one of the model's prompts, put before each text
    # Matryoshka: keep the first ``dimensions`` components of each vector (then normalise); None = all.
    # Checked by :func:`check_dimensions`; applied after the cache, which keeps whole vectors.
    dimensions: int | None = None


def model_defaults(defaults: Defaults) -> EmbedOptions:
    """The options a request gets for what it leaves out: the manifest's ``defaults`` (a
    sentence-transformers folder's pooling, normalisation, truncation and default prompt)."""
    return EmbedOptions(
        pooling=defaults.pooling,  # type: ignore[arg-type]
        long_text=defaults.long_text,
        normalize=defaults.normalize,
        prompt_name=defaults.default_prompt_name,
    )


def prompt_text(name: str | None, prompts: dict[str, str]) -> str | None:
    """The text of the model's prompt ``name`` (None: no prompt).

    Raises:
        ValidationFailed: the model has no prompt of that name.
    """
    if name is None:
        return None
    if name not in prompts:
        if not prompts:
            raise ValidationFailed(
                f"prompt_name {name!r} is not one of this model's prompts: it defines none, so leave prompt_name out"
            )
        raise ValidationFailed(
            f"prompt_name {name!r} is not one of this model's prompts: {', '.join(map(repr, prompts))}"
        )
    return prompts[name]


def check_prompt_fits(name: str, tokens: int, limit: int) -> None:
    """A prompt of ``tokens`` tokens with [CLS] (kept whichever end truncation cuts) leaves room in the
    model's ``limit`` for [SEP] and at least one token of the text.

    Raises:
        ValidationFailed: it does not: every text with it would be the prompt alone, or less.
    """
    if tokens + 2 > limit:
        raise ValidationFailed(
            f"prompt_name {name!r}: its prompt takes {tokens - 1} tokens, and with [CLS] and [SEP] no token of "
            f"the text fits in the model's limit of {limit}; send another prompt_name, or none"
        )


@dataclass(frozen=True)
class EmbedAllOptions:
    """What /embed_all returns for each token; the layer options mean what they mean for /embed."""

    layers: tuple[int, ...] | None = None
    layer_combine: LayerCombine = "concat"
    layer_weights: tuple[float, ...] | None = None
    long_text: LongText = "error"  # "chunk" is refused (see Tokens.embed_all)
    truncation_direction: Direction = "right"
    normalize: bool = False  # each token's vector to unit length
    special_tokens: bool = False  # also return [CLS] and [SEP]
    return_tokens: bool = False  # each token's id, text and character span in the input
    norms: bool = False  # each token's L2 norm (before normalisation)


@dataclass(frozen=True)
class LayerMix:
    """How an item's layers combine into one vector (per token, for /embed_all).

    ``weights`` (``weighted`` only) are one per layer, in the order of the layers, and sum to 1.
    """

    how: LayerCombine = "concat"
    weights: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Resolved:
    """Options checked against the model: 1-based layers and how they combine."""

    layers: tuple[int, ...]
    mix: LayerMix


def resolve_layers(layers: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """Requested layers (1-based or negative from the end; None = the last) as 1-based layers.

    Every route that takes ``layers`` resolves them here, so each refuses the same requests alike.

    Raises:
        ValidationFailed: empty, more than the model has, a layer out of range, or a layer named twice (``[4, 4]``, or ``-1`` and
            its 1-based number): it would be computed and held twice for nothing a single one lacks.
    """
    n = num_layers
    if layers is None:
        return (n,)
    if not layers:
        raise ValidationFailed("layers is empty")
    if len(layers) > n:  # before the loop: a long list is refused without a look at each layer
        raise ValidationFailed(f"at most {n} layers, got {len(layers)}")
    resolved = []
    for layer in layers:
        if not (1 <= layer <= n or -n <= layer <= -1):
            raise ValidationFailed(f"layer {layer} is out of range: use 1..{n} or -{n}..-1")
        resolved.append(layer if layer > 0 else n + 1 + layer)
    if len(set(resolved)) < len(resolved):
        named: dict[int, list[int]] = {}
        for sent, layer in zip(layers, resolved, strict=True):
            named.setdefault(layer, []).append(sent)
        twice = "; ".join(
            f"layer {layer} as {', '.join(map(str, sent))}" for layer, sent in named.items() if len(sent) > 1
        )
        raise ValidationFailed(
            f"layers {list(layers)} name the same layer more than once ({twice}): send each layer once"
        )
    return tuple(resolved)


def resolve_embed(options: EmbedOptions, num_layers: int, has_pooler: bool) -> Resolved:
    """The layers and layer mix of an /embed-like request.

    Raises:
        Unsupported: pooling "pooler" on a model without a pooler.
        ValidationFailed: layers or weights that do not fit the model or each other.
    """
    if options.pooling == POOLER:
        if not has_pooler:
            raise Unsupported("this model has no pooler; use pooling cls or mean")
        if options.layers not in (None, (num_layers,), (-1,)):
            raise ValidationFailed("pooling 'pooler' reads the last layer only; leave out layers")
        layers: tuple[int, ...] = (num_layers,)
    else:
        layers = resolve_layers(options.layers, num_layers)
    return Resolved(layers, layer_mix(options.layer_combine, len(layers), options.layer_weights))


def resolve_embed_all(options: EmbedAllOptions, num_layers: int) -> Resolved:
    """The layers and layer mix of an /embed_all request (see :func:`resolve_embed`)."""
    layers = resolve_layers(options.layers, num_layers)
    return Resolved(layers, layer_mix(options.layer_combine, len(layers), options.layer_weights))


def layer_mix(how: LayerCombine, layers: int, weights: tuple[float, ...] | None) -> LayerMix:
    """Check that ``how`` and ``weights`` fit ``layers`` layers; normalise the weights to sum 1.

    Raises:
        ValidationFailed: weights given without ``weighted`` or missing with it, not one per layer,
            negative, not finite or all zero; ``difference`` with other than two layers.
    """
    if how != "weighted":
        if weights is not None:
            raise ValidationFailed(
                f"layer_weights go with layer_combine 'weighted' only (layer_combine is '{how}')"
            )
        if how == "difference" and layers != 2:
            raise ValidationFailed(
                f"layer_combine 'difference' takes exactly two layers (the first minus the second), "
                f"got {layers}: send layers [a, b]"
            )
        return LayerMix(how)
    if weights is None:
        raise ValidationFailed(
            f"layer_combine 'weighted' needs layer_weights: one weight per layer ({layers} here)"
        )
    if len(weights) != layers:
        raise ValidationFailed(
            f"layer_weights has {len(weights)} weights for {layers} layers: give one weight per layer, "
            "in the order of layers"
        )
    for i, w in enumerate(weights):
        if not math.isfinite(w):
            raise ValidationFailed(f"layer_weights[{i}] is {w}: weights must be finite numbers ≥ 0")
        if w < 0:
            raise ValidationFailed(f"layer_weights[{i}] is {w}: weights must be ≥ 0")
    peak = max(weights)
    if peak == 0:
        raise ValidationFailed(
            "layer_weights are all 0: at least one must be positive (they are scaled to sum 1)"
        )
    scaled = [w / peak for w in weights]  # first to at most 1, so the sum cannot overflow
    total = sum(scaled)
    return LayerMix(how, tuple(w / total for w in scaled))


@dataclass(frozen=True)
class Names:
    """How error messages name a request's texts, in the client's own terms.

    The service works on a flat list of texts; ``item(i)`` names the i-th as the request wrote it
    (``inputs``, ``inputs[2]``, ``inputs.sentences[0]``, ``pairs[1][0]``) and ``field`` the whole.
    """

    field: str
    item: Callable[[int], str]


def listed(field: str, inputs: object) -> Names:
    """Names for ``inputs`` sent as one string (``field``) or as a list (``field[i]``)."""
    if isinstance(inputs, str):
        return Names(field, lambda _i: field)
    return Names(field, lambda i: f"{field}[{i}]")


@dataclass(frozen=True)
class Matryoshka:
    """Whether a model was trained for shorter vectors (Matryoshka representation learning), read as vLLM
    reads it from config.json: ``matryoshka_dimensions`` (the widths it was trained for) or
    ``is_matryoshka`` (any width). The export records it in the manifest (``defaults.matryoshka``)."""

    trained: bool = False
    dimensions: tuple[int, ...] | None = None  # the widths it was trained for; None: any up to its own


def matryoshka_of(defaults: Defaults) -> Matryoshka:
    """What the manifest says of the model's training for shorter vectors."""
    listed = defaults.matryoshka_dimensions
    return Matryoshka(defaults.matryoshka, tuple(listed) if listed is not None else None)


# What the refusal tells a client whose model is not Matryoshka-trained, and its operator.
_NOT_MATRYOSHKA = (
    "this model was not trained for shorter ones (Matryoshka), so a cut vector would lose meaning, not just "
    "detail: leave dimensions out, or send {width}. A checkpoint trained for shorter vectors says so in its "
    "config.json (matryoshka_dimensions or is_matryoshka), or at export: python -m export "
    "--matryoshka-dimensions"
)


def check_dimensions(dimensions: int | None, width: int, matryoshka: Matryoshka) -> None:
    """The ``dimensions`` option of every embedding route and call (OpenAI's and TEI's name): the first
    ``dimensions`` components of each vector.

    A model trained for shorter vectors takes 1..``width``, and one of the widths it lists if it lists
    them (as vLLM requires; its own ``width``, the whole vector, always). Any other model takes only its
    ``width`` (nothing is cut: accepted, where vLLM refuses any ``dimensions``, because clients send the
    width they expect); vLLM and OpenAI refuse the rest alike, since such a model's leading components
    carry no more of the meaning than any others.

    ``width`` is that of the vectors the request makes (several layers side by side are wider).

    Raises:
        ValidationFailed: a ``dimensions`` the model cannot give, saying why and what to send.
    """
    if dimensions is None or dimensions == width:
        return
    if not matryoshka.trained:
        raise ValidationFailed(
            f"dimensions {dimensions} is not supported: the vectors have {width} dimensions, and "
            + _NOT_MATRYOSHKA.format(width=width)
        )
    if not 1 <= dimensions <= width:
        raise ValidationFailed(
            f"dimensions {dimensions} is out of range: the vectors have {width} dimensions; send 1..{width}"
        )
    listed = matryoshka.dimensions
    if listed is not None and dimensions not in listed:
        choices = ", ".join(str(d) for d in sorted({*listed, width}, reverse=True) if d <= width)
        raise ValidationFailed(
            f"dimensions {dimensions} is not one this model was trained for: send one of {choices}"
        )


def vector_key(options: EmbedOptions, resolved: Resolved, token_ids: bool) -> dict[str, object]:
    """Everything besides the text that changes a vector, for the vector cache's key space: pooling, layers
    and the rest; and whether the "texts" are token ids written out (their own key space: ids "101,102"
    are not the text "101,102"). Not ``dimensions``: the cache keeps whole vectors, cut after it
    (normalising a cut of a normalised vector gives what normalising the cut of the raw one does)."""
    return {
        "pooling": options.pooling,
        "layers": list(resolved.layers),  # resolved: -1 and L are the same vector
        "layer_combine": options.layer_combine,
        # scaled to sum 1
        "layer_weights": list(resolved.mix.weights) if resolved.mix.weights is not None else None,
        "normalize": options.normalize,
        "long_text": options.long_text,
        "truncation_direction": options.truncation_direction,
        "input": "token_ids" if token_ids else "text",
        # The texts carry the prompt; its name keys whether it was pooled (include_prompt).
        "prompt": options.prompt_name if not token_ids else None,
        # A vector and, as its last component, the input's tokens (for OpenAI's usage).
        "output": "vector+tokens",
    }
