"""The OpenAI-compatible embeddings route, at ``/v1/embeddings`` and ``/embeddings``.

Thin like the others; errors on these paths take OpenAI's shape (decided in :mod:`app.api.errors`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.disconnect import unless_disconnected
from app.api.encoding import encode_vector
from app.api.errors import OPENAI_PATHS, openapi_responses
from app.api.routes import ServiceDep, json_response
from app.api.schemas import OpenAIEmbeddingRequest, OpenAIEmbeddingResponse
from app.errors import EmptyInput

router = APIRouter()


async def embeddings(body: OpenAIEmbeddingRequest, request: Request, service: ServiceDep) -> Response:
    """OpenAI's embeddings API: mean pooling, normalised, one vector per input."""
    answer = await unless_disconnected(request, service.embeddings(body.input, body.dimensions))
    vectors, tokens = answer.value
    data = [
        {"object": "embedding", "index": i, "embedding": encode_vector(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    payload = {
        "object": "list",
        "data": data,
        "model": service.model.manifest.source.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(payload, answer.timings)


for _path in sorted(OPENAI_PATHS, reverse=True):  # /v1/embeddings first in the docs
    router.add_api_route(
        _path,
        embeddings,
        methods=["POST"],
        response_model=OpenAIEmbeddingResponse,
        responses=openapi_responses(EmptyInput, openai=True),
        include_in_schema=_path.startswith("/v1/"),
    )
