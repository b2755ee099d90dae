"""Request and response shapes of the OpenAI-compatible routes (:mod:`app.api.http.openai_routes`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from app.api.schemas.common import StrictRequest, Text
from app.api.schemas.embeddings import DIMENSIONS
from app.tasks.options import OpenAIEncoding


def _openai_form(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else ""
    if isinstance(first, int) and not isinstance(first, bool):
        return "ids"
    return "id_lists" if isinstance(first, list) else "texts"


TokenIds = list[int]

# OpenAI's four forms of input; the first element of a list decides which (see Inputs).
OpenAIInput = Annotated[
    Annotated[Text, Tag("text")]
    | Annotated[list[Text], Tag("texts")]
    | Annotated[TokenIds, Tag("ids")]
    | Annotated[list[TokenIds], Tag("id_lists")],
    Discriminator(
        _openai_form,
        custom_error_type="input_type",
        custom_error_message="must be a string, a list of strings, a list of token ids or a list of such lists",
    ),
]


class OpenAIEmbeddingRequest(StrictRequest):
    input: OpenAIInput = Field(
        description="A string, a list of strings, a list of token ids, or a list of such lists. Token ids "
        "are this model's (POST /tokenize gives them) and run as given, as TEI does: include [CLS] and [SEP]."
    )
    model: str | None = Field(
        default=None,
        description="The model, by its served name (GET /v1/models). A service of several models answers "
        "404 for a name it does not serve; a service of one accepts any name (OpenAI's clients send their "
        "own). Answers carry the served name.",
    )
    encoding_format: OpenAIEncoding = Field(
        default="float",
        description="float: numbers; base64: little-endian float32 bytes; ubinary / binary: the signs, one "
        "bit a component, packed into bytes as numbers 0..255 / -128..127 (as /embed's encoding).",
    )
    user: str | None = Field(default=None, description="Accepted for compatibility and ignored.")
    dimensions: int | None = Field(default=None, description=DIMENSIONS)


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="When the model's export was written (Unix seconds).")
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Numbers (float, binary, ubinary) or a base64 string.")


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage
