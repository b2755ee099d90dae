"""Request and response shapes of the retrieval stacks' routes (:mod:`app.api.http.retrieval_routes`):
Jina's rerank (``/v1/rerank``), Cohere's rerank (``/v2/rerank``) and embed (``/v2/embed``, ``/v1/embed``),
TEI's ``/decode``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from app.api.schemas.common import Named, Text
from app.api.schemas.heads import Document
from app.tasks.options import Direction, LongText

_TOP_N = "How many results to return, the best first; default (or more than there are documents): all."
_MAX_TOKENS = (
    "Cut each document to its first max_tokens_per_doc tokens before it is ranked. Default: none; a pair "
    "over the model's length is truncated either way (the document's start kept)."
)


class RerankFields(Named):
    query: Text
    documents: list[Document] = Field(description="Strings, or objects with text.")
    top_n: int | None = Field(default=None, ge=1, description=_TOP_N)
    max_tokens_per_doc: int | None = Field(default=None, ge=1, description=_MAX_TOKENS)


class JinaRerankRequest(RerankFields):
    return_documents: bool = Field(
        default=True, description="Each result with its document ({text}): Jina's default, true."
    )


class CohereRerankRequest(RerankFields):
    return_documents: bool = Field(
        default=False, description="Each result with its document ({text}); default false."
    )


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="The document's position in documents.")
    relevance_score: float = Field(description="The score /rerank gives the pair (query, document).")
    document: RerankDocument | None = Field(default=None, description="With return_documents.")


class JinaUsage(BaseModel):
    total_tokens: int = Field(description="The tokens the pairs ran with (capped at the model's length).")


class JinaRerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: JinaUsage


class BilledUnits(BaseModel):
    input_tokens: int | None = None
    search_units: int | None = Field(default=None, description="Rerank: one per 100 documents, as Cohere.")


class CohereMeta(BaseModel):
    api_version: dict[str, str]
    billed_units: BilledUnits


class CohereRerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    meta: CohereMeta


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_query", "search_document", "classification", "clustering", "image"]


class CohereEmbedRequest(Named):
    texts: list[Text] = Field(description="The texts to embed.")
    input_type: InputType | None = Field(
        default=None,
        description="Which of the model's prompts (sentence-transformers') the texts take: search_query: "
        "`search_query` or `query`; search_document: `search_document`, `document`, `passage` or "
        "`corpus`; classification and clustering: the prompt of that name; the first the model has, else "
        "none (the text alone). image: 422. Default: the model's default prompt.",
    )
    embedding_types: list[EmbeddingType] | None = Field(
        default=None,
        max_length=6,
        description="Any of float, int8, uint8, binary, ubinary, base64, at once (one computation). Default "
        "float.",
    )
    # Cohere's truncate, NONE / START / END: its API's own field, not TEI's boolean (Truncation), which
    # every TEI-shaped request declares once; kept apart under its own attribute.
    cohere_truncate: Literal["NONE", "START", "END"] | None = Field(
        default=None,
        alias="truncate",
        description="A text over the model's length: NONE refuses it (422), END cuts its end, START its "
        "start. Default (or null): END.",
    )
    output_dimension: int | None = Field(
        default=None, description="Cohere's name for /embed's dimensions: the vectors' first components."
    )

    def long_text(self) -> LongText:
        return "error" if self.cohere_truncate == "NONE" else "truncate"

    def direction(self) -> Direction:
        return "left" if self.cohere_truncate == "START" else "right"

    def types(self) -> list[EmbeddingType]:
        """The embedding types asked for, each once, in the order given."""
        return list(dict.fromkeys(self.embedding_types or ["float"]))


class CohereEmbeddings(BaseModel):
    float_: list[list[float]] | None = Field(default=None, alias="float")
    int8: list[list[int]] | None = Field(default=None, description="/embed's int8 values (scale max|x|/127).")
    uint8: list[list[int]] | None = Field(default=None, description="The int8 values + 128.")
    binary: list[list[int]] | None = Field(default=None, description="/embed's binary.")
    ubinary: list[list[int]] | None = Field(default=None, description="/embed's ubinary.")
    base64: list[str] | None = Field(default=None, description="/embed's base64.")


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: CohereMeta


def _ids_form(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    return "id_lists" if value and isinstance(value[0], list) else "ids"


class DecodeRequest(Named):
    ids: Annotated[
        Annotated[list[int], Tag("ids")] | Annotated[list[list[int]], Tag("id_lists")],
        Discriminator(
            _ids_form,
            custom_error_type="ids_type",
            custom_error_message="must be a list of token ids or a list of such lists",
        ),
    ] = Field(description="Token ids (as /tokenize gives them), or a list of such lists.")
    skip_special_tokens: bool = Field(default=True, description="Leave [CLS], [SEP], [PAD] … out.")

    def lists(self) -> list[list[int]]:
        ids: list[Any] = self.ids
        return ids if ids and isinstance(ids[0], list) else [ids]


DecodeResponse = list[str]
