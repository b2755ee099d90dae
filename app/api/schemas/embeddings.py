"""/embed, POST /, /similarity and /embed_all: their options (layers, pooling, long inputs, prompts,
normalisation, dimensions, encodings) and answers."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from app.api.schemas.common import (
    Inputs,
    Named,
    Pair,
    StrictRequest,
    Text,
    Token,
    TruncateFields,
    Truncation,
    text_or_list,
)
from app.engine import pooling
from app.tasks.options import (
    EmbedAllOptions,
    EmbedOptions,
    Encoding,
    FloatEncoding,
    LayerCombine,
    LongText,
    Pooling,
)

# One description for every route that takes it (the OpenAI route's too).
DIMENSIONS = (
    "Keep each vector's first `dimensions` components, then normalise (if normalize is on): for a model "
    "trained for shorter vectors (Matryoshka; GET /info says which: defaults.matryoshka), 1..its width, or "
    "one of the widths it lists. Any other model takes only its own width (nothing is cut). Default: all."
)


class LayerFields(Truncation):
    """The layer and long-text options shared by /embed, /similarity and /embed_all."""

    layers: list[int] | None = Field(
        default=None,
        description="Layers to read, 1..L or -L..-1 (from the end), each once (the same layer twice, as "
        "[4, 4] or -1 and L, is a 422); default the last.",
        max_length=64,
    )
    layer_combine: LayerCombine = Field(
        default="concat",
        description="How several layers combine: concat (side by side, in the order of layers); mean; "
        "weighted (by layer_weights); difference (exactly two layers: the first minus the second).",
    )
    layer_weights: list[float] | None = Field(
        default=None,
        description="With layer_combine weighted: one weight ≥ 0 per layer, in the order of layers, not "
        "all 0; scaled to sum 1.",
        max_length=64,
    )
    long_text: LongText | None = Field(
        default=None,
        description="Inputs over the model's length: error (422), truncate, or chunk (windows of at most "
        "the model's length, averaged weighted by tokens; not on /embed_all). Default: truncate if "
        "`truncate` is true, error if it is false, else the model's (truncate for a sentence-transformers "
        "folder, as its encode does; error otherwise).",
    )

    def _long_text(self, default: LongText) -> LongText:
        return self.long_text if self.long_text is not None else self.truncation(default)

    def _layers(self) -> tuple[int, ...] | None:
        return tuple(self.layers) if self.layers is not None else None

    def _weights(self) -> tuple[float, ...] | None:
        return tuple(self.layer_weights) if self.layer_weights is not None else None


class PoolingFields(LayerFields):
    pooling: Pooling | None = Field(default=None, description=pooling.describe())
    prompt_name: str | None = Field(
        default=None,
        description="TEI: one of the model's prompts (its sentence-transformers config_sentence_transformers"
        ".json) to put before each input; default the model's default_prompt_name. A model that defines "
        "none refuses any name (ignoring it would change the vectors the caller expects).",
    )

    def options(self, defaults: EmbedOptions) -> EmbedOptions:
        """The request's options, the model's ``defaults`` for what it left out."""
        if self.model_fields_set.isdisjoint(_OPTION_FIELDS):
            return defaults  # none sent, the usual request: the model's defaults as they are
        return EmbedOptions(
            pooling=self.pooling or defaults.pooling,
            layers=self._layers(),
            layer_combine=self.layer_combine,
            layer_weights=self._weights(),
            long_text=self._long_text(defaults.long_text),
            truncation_direction=self.direction(),
            normalize=self._normalize(defaults.normalize),
            prompt_name=self.prompt_name if self.prompt_name is not None else defaults.prompt_name,
            dimensions=self._dimensions(),
        )

    def _normalize(self, default: bool) -> bool:
        return default

    def _dimensions(self) -> int | None:
        return None


class EmbedFields(PoolingFields):
    """Everything of /embed but its inputs (shared with the root route)."""

    normalize: bool | None = Field(
        default=None,
        description="Scale each vector to unit length. Default: the model's (true, unless a "
        "sentence-transformers folder has no Normalize module).",
    )
    # Not bounded here: every value goes to the one check (app.tasks.options.check_dimensions), so HTTP
    # and gRPC refuse the same request with the same words.
    dimensions: int | None = Field(default=None, description=DIMENSIONS)
    encoding: Encoding = Field(
        default="float",
        description="float: numbers; base64: little-endian float32 bytes; int8: {values, scale} with "
        "vector = values × scale; ubinary: the signs, one bit a component, packed into bytes 0..255 "
        "(ceil(width / 8) a vector); binary: the same bytes less 128 (-128..127). Of the vector cut to "
        "dimensions, when asked. binary and ubinary are sentence-transformers' quantize_embeddings bytes.",
    )

    def _normalize(self, default: bool) -> bool:
        return self.normalize if self.normalize is not None else default

    def _dimensions(self) -> int | None:
        return self.dimensions


# The fields a request's EmbedOptions are read from: none sent means the model's defaults.
_OPTION_FIELDS = frozenset(EmbedFields.model_fields) - {"encoding"}


class EmbedRequest(EmbedFields, Named):
    inputs: Inputs


class Int8Vector(BaseModel):
    values: list[int] = Field(description="int8 values in -127..127.")
    scale: float = Field(description="vector ≈ values × scale (scale = max |x| / 127).")


EmbedResponse = list[list[float] | str | Int8Vector]


class EmbedAllRequest(LayerFields, Named):
    inputs: Inputs
    normalize: bool = Field(default=False, description="Scale each token's vector to unit length.")
    special_tokens: bool = Field(default=False, description="Also return the [CLS] and [SEP] tokens.")
    return_tokens: bool = Field(
        default=False, description="Also return each token's id, text and character span in the input."
    )
    norms: bool = Field(
        default=False, description="Also return each token's L2 norm (taken before normalize)."
    )
    encoding: FloatEncoding = Field(
        default="float", description="float: numbers; base64: little-endian float32 bytes, per token."
    )

    def options(self, long_text: LongText = "error") -> EmbedAllOptions:
        """The options; ``long_text`` is the model's default for inputs over its length."""
        return EmbedAllOptions(
            layers=self._layers(),
            layer_combine=self.layer_combine,
            layer_weights=self._weights(),
            long_text=self._long_text(long_text),
            truncation_direction=self.direction(),
            normalize=self.normalize,
            special_tokens=self.special_tokens,
            return_tokens=self.return_tokens,
            norms=self.norms,
        )


class TokenVectors(BaseModel):
    """One input's answer when return_tokens or norms is on; only the parts asked for are present."""

    vectors: list[list[float] | str]
    tokens: list[Token] | None = Field(default=None, description="With return_tokens.")
    norms: list[float] | None = Field(default=None, description="With norms.")


# Per input: its token vectors in order (TEI's shape), or a TokenVectors with return_tokens / norms.
EmbedAllResponse = list[list[list[float] | str] | TokenVectors]


class SimilarityInputs(StrictRequest):
    source_sentence: Text
    sentences: list[Text]


class SimilarityRequest(PoolingFields, Named):
    inputs: SimilarityInputs | None = None
    pairs: list[Pair] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.inputs is None) == (self.pairs is None):
            raise ValueError("give exactly one of inputs {source_sentence, sentences} or pairs")
        return self


def _root_form(value: Any) -> str | None:
    return "similarity" if isinstance(value, dict) else text_or_list(value)


class RootRequest(EmbedFields, Named):
    """TEI's root route: texts embed as on /embed; ``{source_sentence, sentences}`` scores as on /similarity."""

    inputs: Annotated[
        Annotated[Text, Tag("text")]
        | Annotated[list[Text], Tag("list")]
        | Annotated[SimilarityInputs, Tag("similarity")],
        Discriminator(
            _root_form,
            custom_error_type="inputs_type",
            custom_error_message="must be a string, a list of strings, or {source_sentence, sentences}",
        ),
    ]


class EmbedSparseRequest(TruncateFields, Named):
    """TEI's /embed_sparse: its fields, and ``top_k``."""

    inputs: Inputs
    top_k: int | None = Field(
        default=None,
        description="Keep each vector's k largest weights (in index order still); default every non-zero one.",
    )
    prompt_name: str | None = Field(
        default=None,
        description="TEI's field; not taken here (refused when sent): send the text with its prompt.",
    )

    @model_validator(mode="after")
    def _no_prompt(self) -> Self:
        if self.prompt_name is not None:
            raise ValueError("prompt_name is not supported on /embed_sparse: send the text with its prompt")
        return self


class SparseValue(BaseModel):
    index: int = Field(description="The vocabulary entry (token id).")
    value: float = Field(description="Its weight, > 0: log(1 + relu(logit)), pooled over the input's tokens.")


# Per input, its non-zero weights in index order (TEI's shape).
EmbedSparseResponse = list[list[SparseValue]]
