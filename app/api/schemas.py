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
        "`truncate` is true, error if it is false, else the model's (truncate for a sentence-transformers "
        "folder, as its encode does; error otherwise).",
    )
    truncate: bool = Field(default=False, description="TEI: truncate inputs over the model's length.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right", description="Which end truncation keeps: right keeps the start."
    )

    def _long_text(self, default: LongText) -> LongText:
        if self.long_text is not None:
            return self.long_text
        if "truncate" in self.model_fields_set:  # TEI's flag, sent: true truncates, false refuses
            return "truncate" if self.truncate else "error"
        return default

    def _direction(self) -> Direction:
        return "left" if self.truncation_direction.lower() == "left" else "right"

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
            truncation_direction=self._direction(),
            normalize=self._normalize(defaults.normalize),
            prompt_name=self.prompt_name if self.prompt_name is not None else defaults.prompt_name,
        )

    def _normalize(self, default: bool) -> bool:
        return default


class EmbedFields(PoolingFields):
    """Everything of /embed but its inputs (shared with the root route)."""

    normalize: bool | None = Field(
        default=None,
        description="Scale each vector to unit length. Default: the model's (true, unless a "
        "sentence-transformers folder has no Normalize module).",
    )
    encoding: Encoding = Field(
        default="float",
        description="float: numbers; base64: little-endian float32 bytes; int8: {values, scale} with "
        "vector = values × scale.",
    )

    def _normalize(self, default: bool) -> bool:
        return self.normalize if self.normalize is not None else default


# The fields a request's EmbedOptions are read from: none sent means the model's defaults.
_OPTION_FIELDS = frozenset(EmbedFields.model_fields) - {"encoding"}


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

    def options(self, long_text: LongText = "error") -> EmbedAllOptions:
        """The options; ``long_text`` is the model's default for inputs over its length."""
        return EmbedAllOptions(
            layers=self._layers(),
            layer_combine=self.layer_combine,
            layer_weights=self._weights(),
            long_text=self._long_text(long_text),
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


# --- fine-tuned heads: /predict and /rerank in TEI's shapes, /token-classification in transformers' ---


def _predict_form(value: Any) -> str | None:
    # TEI's untagged PredictInput: a string or a pair is one input; any other list is a batch.
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return "pair"
    return "batch" if isinstance(value, list) else None


def _sequence_form(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "pair" if isinstance(value, list) else None


TextPair = Annotated[list[Text], Field(min_length=2, max_length=2)]
PredictSequence = Annotated[
    Annotated[Text, Tag("text")] | Annotated[TextPair, Tag("pair")],
    Discriminator(
        _sequence_form,
        custom_error_type="inputs_type",
        custom_error_message="must be a string or a pair [text, text_pair]",
    ),
]


class HeadFields(StrictRequest):
    truncate: bool = Field(default=False, description="TEI: truncate inputs over the model's length.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right", description="Which end truncation keeps: right keeps the start."
    )

    def long_text(self) -> LongText:
        return "truncate" if self.truncate else "error"

    def direction(self) -> Direction:
        return "left" if self.truncation_direction.lower() == "left" else "right"


class PredictRequest(HeadFields):
    """TEI's /predict: one input (a text, or a pair ``[text, text_pair]``) or a batch of them."""

    inputs: Annotated[
        Annotated[Text, Tag("text")]
        | Annotated[TextPair, Tag("pair")]
        | Annotated[list[PredictSequence], Tag("batch")],
        Discriminator(
            _predict_form,
            custom_error_type="inputs_type",
            custom_error_message="must be a string, a pair [text, text_pair], or a list of them",
        ),
    ]
    raw_scores: bool = Field(default=False, description="Logits instead of probabilities.")

    def single(self) -> bool:
        return isinstance(self.inputs, str) or _predict_form(self.inputs) == "pair"

    def sequences(self) -> list[str | tuple[str, str]]:
        """The inputs as texts and (text, text_pair) tuples, one input when :meth:`single`."""
        items: list[Any] = [self.inputs] if self.single() else list(self.inputs)
        return [x if isinstance(x, str) else (x[0], x[1]) for x in items]


class LabelScore(BaseModel):
    score: float
    label: str


PredictResponse = list[LabelScore] | list[list[LabelScore]]


class RerankRequest(HeadFields):
    query: Text
    texts: list[Text]
    raw_scores: bool = Field(default=False, description="Logits instead of the model's scores (sigmoid).")
    return_text: bool = Field(default=False, description="Also return each text.")


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


RerankResponse = list[Rank]

AggregationName = Literal["none", "simple", "first", "average", "max"]


class TokenClassificationParameters(StrictRequest):
    """The options in the Hugging Face Inference API's form, as huggingface_hub's InferenceClient sends them."""

    aggregation_strategy: AggregationName | None = None
    ignore_labels: list[str] | None = Field(default=None, max_length=256)
    stride: int | None = Field(
        default=None, description="Accepted for the client's sake; must be 0 or absent."
    )


class TokenClassificationRequest(HeadFields):
    inputs: Inputs
    aggregation_strategy: AggregationName = Field(
        default="simple",
        description="How tokens become entities, as transformers' token-classification pipeline: none (each "
        "token), simple (tokens grouped by B-/I- tags), first / average / max (words first, scored by their "
        "first token, the mean of their tokens, or their best token).",
    )
    ignore_labels: list[str] = Field(
        default=["O"], max_length=256, description="Labels left out of the answer."
    )
    parameters: TokenClassificationParameters | None = None

    def strategy(self) -> AggregationName:
        given = self.parameters.aggregation_strategy if self.parameters is not None else None
        return given or self.aggregation_strategy

    def ignored(self) -> list[str]:
        given = self.parameters.ignore_labels if self.parameters is not None else None
        return given if given is not None else self.ignore_labels


class Entity(BaseModel):
    entity_group: str | None = None
    entity: str | None = None
    score: float
    index: int | None = None
    word: str
    start: int
    end: int


TokenClassificationResponse = list[Entity] | list[list[Entity]]
