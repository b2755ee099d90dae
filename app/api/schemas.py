"""Request and response shapes; the request half is TEI-compatible where TEI has the same endpoint."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from app.service import EmbedOptions


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); no tokenizer can take them, so refuse them here.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: {exc.reason} at {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]
Inputs = Text | list[Text]


class _Request(BaseModel):
    # Strict: "1" is not a number and 1 is not a string. Unknown fields are ignored, as TEI does.
    model_config = ConfigDict(strict=True, extra="ignore")


class PoolingFields(_Request):
    pooling: Literal["cls", "mean", "pooler"] = Field(
        default="mean",
        description="cls: the [CLS] state; mean: mean over tokens ([CLS]/[SEP] included); "
        "pooler: BERT's pooler output (last layer only).",
    )
    layers: list[int] | None = Field(
        default=None,
        description="Layers to pool, 1..L or -L..-1 (from the end); default the last.",
        max_length=64,
    )
    layer_combine: Literal["concat", "mean"] = Field(
        default="concat", description="How several layers combine."
    )
    long_text: Literal["error", "truncate", "chunk"] | None = Field(
        default=None,
        description="Inputs over the model's length: error (422), truncate, or chunk (windows of at most "
        "the model's length, averaged weighted by tokens). Default: truncate if `truncate`, else error.",
    )
    truncate: bool = Field(default=False, description="TEI: truncate inputs over the model's length.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right", description="Which end truncation keeps: right keeps the start."
    )

    def options(self, normalize: bool = True) -> EmbedOptions:
        long_text = self.long_text or ("truncate" if self.truncate else "error")
        direction: Literal["right", "left"] = (
            "left" if self.truncation_direction.lower() == "left" else "right"
        )
        return EmbedOptions(
            pooling=self.pooling,
            layers=tuple(self.layers) if self.layers is not None else None,
            layer_combine=self.layer_combine,
            long_text=long_text,
            truncation_direction=direction,
            normalize=normalize,
        )


class EmbedRequest(PoolingFields):
    inputs: Inputs
    normalize: bool = Field(default=True, description="Scale each vector to unit length.")
    encoding: Literal["float", "base64", "int8"] = Field(
        default="float",
        description="float: numbers; base64: little-endian float32 bytes; int8: {values, scale} with "
        "vector = values × scale.",
    )


class Int8Vector(BaseModel):
    values: list[int] = Field(description="int8 values in -127..127.")
    scale: float = Field(description="vector ≈ values × scale (scale = max |x| / 127).")


EmbedResponse = list[list[float] | str | Int8Vector]


# A list, not a tuple: strict mode would refuse the JSON array a tuple is sent as.
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]


class SimilarityInputs(_Request):
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


class FillMaskRequest(_Request):
    inputs: Inputs
    top_k: int = Field(default=5, ge=1, le=50, description="Predictions per [MASK], 1..50.")


class Prediction(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


FillMaskResponse = list[list[list[Prediction]]]


class TokenizeRequest(_Request):
    inputs: Inputs
    add_special_tokens: bool = True


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int = Field(description="Character offset where the token starts in the input.")
    stop: int = Field(description="Character offset just past the token's end.")


TokenizeResponse = list[list[Token]]


# --- OpenAI-compatible embeddings ------------------------------------------------------------------


class OpenAIEmbeddingRequest(_Request):
    input: Inputs = Field(description="A string or a list of strings (token arrays are not accepted).")
    model: str | None = Field(
        default=None, description="Accepted for compatibility; the loaded model answers whatever is named."
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="float: numbers; base64: little-endian float32 bytes."
    )
    user: str | None = Field(default=None, description="Accepted for compatibility and ignored.")
    dimensions: int | None = Field(
        default=None, description="Only the model's own width is accepted: vectors are never shortened."
    )


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage
