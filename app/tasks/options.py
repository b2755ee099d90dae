"""Request options: each vocabulary declared once, the frozen option objects, and their checks against the
model. The API schemas reuse these ``Literal`` types; pooling's is declared beside its functions in
:mod:`app.engine.pooling`, so a new mode is one module's change."""

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
    """What /embed, /similarity and the OpenAI route compute; a model's own defaults replace these."""

    pooling: Pooling = "mean"
    layers: tuple[int, ...] | None = None  # as requested: 1-based, negatives from the end; None = last
    layer_combine: LayerCombine = "concat"
    layer_weights: tuple[float, ...] | None = None  # layer_combine "weighted": one per layer, as sent
    long_text: LongText = "error"
    truncation_direction: Direction = "right"
    normalize: bool = True
    prompt_name: str | None = None  # one of the model's prompts, put before each text
    # Matryoshka: keep the first ``dimensions`` components (then normalise), after the cache; None = all.
    dimensions: int | None = None


def model_defaults(defaults: Defaults) -> EmbedOptions:
    """The options a request gets for what it leaves out: the manifest's ``defaults``."""
    return EmbedOptions(
        pooling=defaults.pooling,  # type: ignore[arg-type]
        long_text=defaults.long_text,
        normalize=defaults.normalize,
        prompt_name=defaults.default_prompt_name,
    )


def prompt_text(name: str | None, prompts: dict[str, str]) -> str | None:
    """The text of the model's prompt ``name`` (None: no prompt); ValidationFailed for an unknown name."""
    if name is None:
        return None
    if name not in prompts:
        known = ", ".join(map(repr, prompts)) or "it defines none, so leave prompt_name out"
        raise ValidationFailed(f"prompt_name {name!r} is not one of this model's prompts: {known}")
    return prompts[name]


def check_prompt_fits(name: str, tokens: int, limit: int) -> None:
    """Refuse a prompt (``tokens`` with [CLS]) leaving no room in ``limit`` for [SEP] and a text token."""
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
    """How an item's layers combine; ``weights`` (``weighted`` only): one per layer, summing to 1."""

    how: LayerCombine = "concat"
    weights: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Resolved:
    """Options checked against the model: 1-based layers and how they combine."""

    layers: tuple[int, ...]
    mix: LayerMix


def resolve_layers(layers: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """Requested layers (1-based or negative from the end; None = the last) as 1-based layers, each once."""
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
        sent = list(zip(layers, resolved, strict=True))
        twice = "; ".join(
            f"layer {layer} as {', '.join(str(s) for s, r in sent if r == layer)}"
            for layer in dict.fromkeys(resolved)
            if resolved.count(layer) > 1
        )
        raise ValidationFailed(
            f"layers {list(layers)} name the same layer more than once ({twice}): send each layer once"
        )
    return tuple(resolved)


def resolve_embed(options: EmbedOptions, num_layers: int, has_pooler: bool) -> Resolved:
    """The layers and layer mix of an /embed-like request; pooling "pooler" reads the last layer only."""
    if options.pooling == POOLER:
        if not has_pooler:
            raise Unsupported("this model has no pooler; use pooling cls or mean")
        if options.layers not in (None, (num_layers,), (-1,)):
            raise ValidationFailed("pooling 'pooler' reads the last layer only; leave out layers")
    return resolve_embed_all(options, num_layers)


def resolve_embed_all(options: EmbedOptions | EmbedAllOptions, num_layers: int) -> Resolved:
    """The layers and layer mix of an /embed_all (or /embed) request."""
    layers = resolve_layers(options.layers, num_layers)
    return Resolved(layers, layer_mix(options.layer_combine, len(layers), options.layer_weights))


def layer_mix(how: LayerCombine, layers: int, weights: tuple[float, ...] | None) -> LayerMix:
    """Check that ``how`` and ``weights`` fit ``layers`` layers; normalise the weights to sum 1."""
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
        if not (math.isfinite(w) and w >= 0):
            must = "≥ 0" if math.isfinite(w) else "finite numbers ≥ 0"
            raise ValidationFailed(f"layer_weights[{i}] is {w}: weights must be {must}")
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
    """How error messages name a request's texts: ``field`` the whole, ``item(i)`` one (``inputs[2]``)."""

    field: str
    item: Callable[[int], str]


def listed(field: str, inputs: object) -> Names:
    """Names for ``inputs`` sent as one string (``field``) or as a list (``field[i]``)."""
    if isinstance(inputs, str):
        return Names(field, lambda _i: field)
    return Names(field, lambda i: f"{field}[{i}]")


def check_dimensions(dimensions: int | None, width: int, defaults: Defaults) -> None:
    """The ``dimensions`` option of every embedding route and call, for vectors ``width`` wide: a model not
    trained for shorter ones (defaults.matryoshka) takes only ``width`` (its leading parts mean no more)."""
    if dimensions is None or dimensions == width:
        return
    if not defaults.matryoshka:
        raise ValidationFailed(
            f"dimensions {dimensions} is not supported: the vectors have {width} dimensions, and this model "
            "was not trained for shorter ones (Matryoshka), so a cut vector would lose meaning, not just "
            f"detail: leave dimensions out, or send {width}. A checkpoint trained for shorter vectors says "
            "so in its config.json (matryoshka_dimensions or is_matryoshka), or at export: python -m export "
            "--matryoshka-dimensions"
        )
    if not 1 <= dimensions <= width:
        raise ValidationFailed(
            f"dimensions {dimensions} is out of range: the vectors have {width} dimensions; send 1..{width}"
        )
    listed = defaults.matryoshka_dimensions
    if listed is not None and dimensions not in listed:
        choices = ", ".join(str(d) for d in sorted({*listed, width}, reverse=True) if d <= width)
        raise ValidationFailed(
            f"dimensions {dimensions} is not one this model was trained for: send one of {choices}"
        )


def vector_key(options: EmbedOptions, resolved: Resolved, token_ids: bool) -> dict[str, object]:
    """Everything besides the text that changes a cached vector. Token ids written out have their own key
    space ("101,102" is not that text). Not ``dimensions``: the cache keeps whole vectors, cut after it."""
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
