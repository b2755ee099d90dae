"""The fine-tuned heads: /predict and /rerank in TEI's shapes, /token-classification in transformers'."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from app.api.schemas.common import Inputs, Named, Pair, StrictRequest, Text, TruncateFields


def _predict_form(value: Any) -> str | None:
    # TEI's untagged PredictInput: a string or a pair is one input; any other list is a batch.
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return "pair"
    return "batch" if isinstance(value, list) else None


def _sequence_form(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "pair" if isinstance(value, list) else None


PredictSequence = Annotated[
    Annotated[Text, Tag("text")] | Annotated[Pair, Tag("pair")],
    Discriminator(
        _sequence_form,
        custom_error_type="inputs_type",
        custom_error_message="must be a string or a pair [text, text_pair]",
    ),
]


class PredictRequest(TruncateFields, Named):
    """TEI's /predict: one input (a text, or a pair ``[text, text_pair]``) or a batch of them."""

    inputs: Annotated[
        Annotated[Text, Tag("text")]
        | Annotated[Pair, Tag("pair")]
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


class DocumentObject(StrictRequest):
    text: Text


def _document_form(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "document" if isinstance(value, dict) else None


# A document: a string, or an object with ``text`` (Jina's and Cohere's v1 form; other fields ignored).
Document = Annotated[
    Annotated[Text, Tag("text")] | Annotated[DocumentObject, Tag("document")],
    Discriminator(
        _document_form,
        custom_error_type="document_type",
        custom_error_message="must be a string or an object with text",
    ),
]


def document_texts(documents: list[str | DocumentObject]) -> list[str]:
    """The texts of ``documents``, in order."""
    return [d if isinstance(d, str) else d.text for d in documents]


class RerankRequest(TruncateFields, Named):
    query: Text
    texts: list[Text] = Field(default_factory=list, description="The texts to rank (or send documents).")
    documents: list[Document] | None = Field(
        default=None, description="In place of texts, as Jina and Cohere send them: strings or {text}."
    )
    raw_scores: bool = Field(default=False, description="Logits instead of the model's scores (sigmoid).")
    return_text: bool = Field(default=False, description="Also return each text.")

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        sent = "texts" in self.model_fields_set
        if self.documents is None:
            if not sent:
                raise PydanticCustomError("texts_required", "texts is required (or documents in its place)")
        elif sent:
            raise PydanticCustomError("texts_documents", "send texts or documents, not both")
        else:
            self.texts = document_texts(self.documents)
        return self


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


class TokenClassificationRequest(TruncateFields, Named):
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
