"""Request and response shapes; the request half is TEI-compatible where TEI has the same endpoint."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from app.engine import pooling
from app.options import (
    Direction,
    EmbedAllOptions,
    EmbedOptions,
    Encoding,
    FloatEncoding,
    LayerCombine,
    LongText,
    Pooling,
)


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); no tokenizer can take them, so refuse them here.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "text_unicode",
            "is not valid Unicode: {reason} at character {at} (a lone UTF-16 surrogate has no UTF-8 form)",
            {"reason": exc.reason, "at": exc.start},
        ) from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


def _text_or_list(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None


# A callable discriminator picks the one form that fits the JSON value, so an error speaks of that form
# only ("inputs[3] must be a string"), never of every alternative as a plain union's errors would.
Inputs = Annotated[
    Annotated[Text, Tag("text")] | Annotated[list[Text], Tag("list")],
    Discriminator(
        _text_or_list,
        custom_error_type="inputs_type",
        custom_error_message="must be a string or a list of strings",
    ),
]
# The union tags above (and below), which are no field names: error locations leave them out.
UNION_TAGS = frozenset({"text", "list", "ids", "id_lists", "texts", "similarity"})


class StrictRequest(BaseModel):
    # Strict: "1" is not a number and 1 is not a string. Unknown fields are ignored, as TEI does.
    model_config = ConfigDict(strict=True, extra="ignore")


class LayerFields(StrictRequest):
    """The layer and long-text options shared by /embed, /similarity and /embed_all."""

    layers: list[int] | None = Field(
        default=None,
        description="Layers to read, 1..L or -L..-1 (from the end); default the last.",
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
        "`truncate`, else error.",
    )
    truncate: bool = Field(default=False, description="TEI: truncate inputs over the model's length.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right", description="Which end truncation keeps: right keeps the start."
    )

    def _long_text(self) -> LongText:
        return self.long_text or ("truncate" if self.truncate else "error")

    def _direction(self) -> Direction:
        return "left" if self.truncation_direction.lower() == "left" else "right"

    def _layers(self) -> tuple[int, ...] | None:
        return tuple(self.layers) if self.layers is not None else None

    def _weights(self) -> tuple[float, ...] | None:
        return tuple(self.layer_weights) if self.layer_weights is not None else None


def _no_prompt(name: str | None) -> None:
    # Runs only when prompt_name is sent (defaults are not validated): no cost on other requests.
    if name is not None:
        raise PydanticCustomError(
            "prompt_name",
            "{name} is not one of this model's prompts: it defines none, so leave prompt_name out",
            {"name": repr(name)},
        )


class PoolingFields(LayerFields):
    pooling: Pooling = Field(default="mean", description=pooling.describe())
    prompt_name: Annotated[str | None, AfterValidator(_no_prompt)] = Field(
        default=None,
        description="TEI: a prompt of the model's to put before each input. bert-base-chinese defines none, "
        "so only null is accepted (ignoring a name would change the vectors the caller expects).",
    )

    def options(self, normalize: bool = True) -> EmbedOptions:
        if self.model_fields_set.isdisjoint(_POOLING_OPTIONS):
            # None of them sent, the usual request: the options of the defaults, built once.
            return _DEFAULT_OPTIONS[normalize]
        return self._options(normalize)

    def _options(self, normalize: bool) -> EmbedOptions:
        return EmbedOptions(
            pooling=self.pooling,
            layers=self._layers(),
            layer_combine=self.layer_combine,
            layer_weights=self._weights(),
            long_text=self._long_text(),
            truncation_direction=self._direction(),
            normalize=normalize,
        )


# The fields EmbedOptions is read from (prompt_name only ever refuses a request).
_POOLING_OPTIONS = frozenset(PoolingFields.model_fields) - {"prompt_name"}
_DEFAULT_OPTIONS = {n: PoolingFields()._options(n) for n in (False, True)}


class EmbedFields(PoolingFields):
    """Everything of /embed but its inputs (shared with the root route)."""

    normalize: bool = Field(default=True, description="Scale each vector to unit length.")
    encoding: Encoding = Field(
        default="float",
        description="float: numbers; base64: little-endian float32 bytes; int8: {values, scale} with "
        "vector = values × scale.",
    )


class EmbedRequest(EmbedFields):
    inputs: Inputs


class Int8Vector(BaseModel):
    values: list[int] = Field(description="int8 values in -127..127.")
    scale: float = Field(description="vector ≈ values × scale (scale = max |x| / 127).")


EmbedResponse = list[list[float] | str | Int8Vector]


class EmbedAllRequest(LayerFields):
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

    def options(self) -> EmbedAllOptions:
        return EmbedAllOptions(
            layers=self._layers(),
            layer_combine=self.layer_combine,
            layer_weights=self._weights(),
            long_text=self._long_text(),
            truncation_direction=self._direction(),
            normalize=self.normalize,
            special_tokens=self.special_tokens,
            return_tokens=self.return_tokens,
            norms=self.norms,
        )


class Token(BaseModel):
    id: int
    text: str
    special: bool
    # Code points, as Python indexes a str: an emoji counts 1 (JavaScript's String counts it 2).
    start: int = Field(description="Character (code point) offset where the token starts in the input.")
    stop: int = Field(description="Character (code point) offset just past the token's end.")


class TokenVectors(BaseModel):
    """One input's answer when return_tokens or norms is on; only the parts asked for are present."""

    vectors: list[list[float] | str]
    tokens: list[Token] | None = Field(default=None, description="With return_tokens.")
    norms: list[float] | None = Field(default=None, description="With norms.")


# Per input: its token vectors in order (TEI's shape), or a TokenVectors with return_tokens / norms.
EmbedAllResponse = list[list[list[float] | str] | TokenVectors]


# A list, not a tuple: strict mode would refuse the JSON array a tuple is sent as.
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]


class SimilarityInputs(StrictRequest):
    source_sentence: Text
    sentences: list[Text]


class SimilarityRequest(PoolingFields):
    inputs: SimilarityInputs | None = None
    pairs: list[Pair] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.inputs is None) == (self.pairs is None):
            raise ValueError("give exactly one of inputs {source_sentence, sentences} or pairs")
        return self


def _root_form(value: Any) -> str | None:
    return "similarity" if isinstance(value, dict) else _text_or_list(value)


class RootRequest(EmbedFields):
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


# The answer holds at most top_k (≤ 50) targets, but the candidate set may be larger: rank a class of a
# couple of hundred words and read the best 50. Each target costs a vocabulary look-up on the event loop
# (~0.5 µs) and, if it is not a token, one more text on the tokenisation thread: 256 keep that near 0.1 ms.
MAX_TARGETS = 256


class FillMaskParameters(StrictRequest):
    """The options in the Hugging Face Inference API's form, as huggingface_hub's InferenceClient sends them."""

    top_k: int | None = Field(
        default=None, ge=1, le=50, description="Predictions per [MASK], 1..50: the top-level top_k."
    )
    targets: (
        Annotated[
            Annotated[Text, Tag("text")]
            | Annotated[list[Text], Field(min_length=1, max_length=MAX_TARGETS), Tag("list")],
            Discriminator(
                _text_or_list,
                custom_error_type="targets_type",
                custom_error_message="must be a string or a list of strings",
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Only these tokens compete, scored by their probability over the whole vocabulary, "
        f"as the pipeline's targets (at most {MAX_TARGETS}): a target that is not a vocabulary token "
        "stands for its first token, one with no token is ignored; top_k is capped at their number.",
    )


class FillMaskRequest(StrictRequest):
    inputs: Inputs
    top_k: int = Field(
        default=5, ge=1, le=50, description="Predictions per [MASK], 1..50 (or parameters.top_k)."
    )
    parameters: FillMaskParameters | None = Field(
        default=None, description="Hugging Face's form of the options: {top_k, targets}."
    )

    @model_validator(mode="after")
    def _top_k_once(self) -> Self:
        given = self.parameters.top_k if self.parameters is not None else None
        if given is not None and "top_k" in self.model_fields_set and given != self.top_k:
            raise ValueError(
                f"top_k is {self.top_k} but parameters.top_k is {given}: give top_k once, in either place"
            )
        return self

    def wanted_top_k(self) -> int:
        """``parameters.top_k`` if given, else the top-level ``top_k`` (default 5)."""
        given = self.parameters.top_k if self.parameters is not None else None
        return given if given is not None else self.top_k

    def target_list(self) -> list[str] | None:
        """``parameters.targets`` as a list; None when not given."""
        targets = self.parameters.targets if self.parameters is not None else None
        return [targets] if isinstance(targets, str) else targets


class Prediction(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


# One input's answer, as the pipeline gives it: the candidates for its one [MASK], or for several masks
# one list of candidates per mask.
FillMaskAnswer = list[Prediction] | list[list[Prediction]]
# A string's answer alone; a list of inputs (even of one) gets one answer per input.
FillMaskResponse = FillMaskAnswer | list[FillMaskAnswer]


class TokenizeRequest(StrictRequest):
    inputs: Inputs
    add_special_tokens: bool = True


TokenizeResponse = list[list[Token]]
