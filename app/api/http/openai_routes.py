"""The OpenAI-compatible routes: embeddings at ``/v1/embeddings`` (and ``/embeddings``), and the model
list at ``/v1/models`` that several OpenAI clients read first.

Thin like the others; errors on these paths take OpenAI's shape (decided in :mod:`app.api.errors`).
Every answer names the model by its served name (``ZHEMBED_SERVED_MODEL_NAME``, or the names of
``ZHEMBED_MODELS``), never by a path; the embeddings route's model is the one the request names (of
several), chosen on the data path (:mod:`app.api.http.fast`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.encoding import encode_vectors
from app.api.errors import OPENAI_PATHS, OpenAIErrorBody, openapi_responses
from app.api.http.disconnect import unless_disconnected
from app.api.http.openai_schemas import (
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    OpenAIModel,
    OpenAIModelList,
)
from app.api.http.routes import ModelsDep, ServiceDep, json_response
from app.errors import EmptyInput, UnknownModel
from app.tasks.service import Service

router = APIRouter()


async def embeddings(body: OpenAIEmbeddingRequest, request: Request, service: ServiceDep) -> Response:
    """OpenAI's embeddings API: mean pooling, normalised, one vector per input (text or token ids)."""
    answer = await unless_disconnected(request, service.embeddings.openai(body.input, body.dimensions))
    vectors, tokens = answer.value
    data = [
        {"object": "embedding", "index": i, "embedding": v}
        for i, v in enumerate(encode_vectors(vectors, body.encoding_format))
    ]
    payload = {
        "object": "list",
        "data": data,
        "model": service.served_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(payload, answer.timings)


for _path in sorted(OPENAI_PATHS, reverse=True):  # /v1/embeddings first in the docs
    router.add_api_route(
        _path,
        embeddings,
        methods=["POST"],
        response_model=OpenAIEmbeddingResponse,
        responses=openapi_responses(UnknownModel, EmptyInput, body=OpenAIErrorBody),
        include_in_schema=_path.startswith("/v1/"),
    )


def _card(service: Service) -> dict[str, object]:
    return {"id": service.served_name, "object": "model", "created": service.created, "owned_by": "zhembed"}


@router.get("/v1/models", response_model=OpenAIModelList, responses=openapi_responses(body=OpenAIErrorBody))
async def models(served: ModelsDep) -> Response:
    """OpenAI's model list: every model this server serves, by its served name, the default first."""
    return json_response({"object": "list", "data": [_card(service) for service in served.services]})


@router.get(
    "/v1/models/{model:path}",
    response_model=OpenAIModel,
    responses=openapi_responses(UnknownModel, body=OpenAIErrorBody),
)
async def model(model: str, served: ModelsDep) -> Response:
    """OpenAI's model retrieval: a served model, or 404 for any other name (listing the served ones)."""
    return json_response(_card(served.get(model)))
