"""The routes the retrieval stacks call besides TEI's and OpenAI's: Jina's rerank (``/v1/rerank``), Cohere's
rerank (``/v2/rerank``) and embed (``/v2/embed``, and ``/v1/embed`` in v1's shape), and TEI's ``/decode``.

Thin like the others: the numbers are the tasks' (:mod:`app.tasks.retrieval`), which are ``/rerank``'s
scores and ``/embed``'s vectors; errors on these paths take each API's own shape (decided in
:mod:`app.api.errors`). Every answer names the model by its served name.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.encoding import binary_vectors, encode_vectors, int8_vectors
from app.api.errors import CohereErrorBody, JinaErrorBody, openapi_responses
from app.api.http.disconnect import unless_disconnected
from app.api.http.retrieval_schemas import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereRerankRequest,
    CohereRerankResponse,
    DecodeRequest,
    DecodeResponse,
    JinaRerankRequest,
    JinaRerankResponse,
    RerankFields,
)
from app.api.http.routes import ServiceDep, json_response
from app.api.schemas.heads import document_texts
from app.errors import EmptyInput, UnknownModel, Unsupported
from app.tasks.answers import Answer
from app.tasks.service import Service

router = APIRouter()

_RERANK_ERRORS = (UnknownModel, EmptyInput, Unsupported)


async def _ranked(
    body: RerankFields, request: Request, service: Service, return_documents: bool
) -> tuple[Answer[tuple[list[dict[str, object]], int]], list[dict[str, Any]]]:
    """The rerank task's answer for ``body`` and its results in Jina's and Cohere's shape, ``top_n`` kept."""
    documents = document_texts(body.documents)
    answer = await unless_disconnected(
        request,
        service.retrieval.rerank(body.query, documents, body.max_tokens_per_doc, "truncate", "right"),
    )
    ranks, _ = answer.value
    results: list[dict[str, Any]] = []
    for rank in ranks[: body.top_n]:
        index = int(rank["index"])  # type: ignore[call-overload]
        result: dict[str, Any] = {"index": index, "relevance_score": rank["score"]}
        if return_documents:
            result["document"] = {"text": documents[index]}
        results.append(result)
    return answer, results


@router.post(
    "/v1/rerank",
    response_model=JinaRerankResponse,
    responses=openapi_responses(*_RERANK_ERRORS, body=JinaErrorBody),
)
async def jina_rerank(body: JinaRerankRequest, request: Request, service: ServiceDep) -> Response:
    """Jina's rerank API (which vLLM, LocalAI and Xinference serve too): each document's relevance to the
    query, best first: ``/rerank``'s score of the pair."""
    answer, results = await _ranked(body, request, service, body.return_documents)
    payload = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": service.served_name,
        "results": results,
        "usage": {"total_tokens": answer.value[1]},
    }
    return json_response(payload, answer.timings)


def _meta(**billed: int) -> dict[str, Any]:
    return {"api_version": {"version": "2"}, "billed_units": billed}


@router.post(
    "/v2/rerank",
    response_model=CohereRerankResponse,
    responses=openapi_responses(*_RERANK_ERRORS, body=CohereErrorBody),
)
async def cohere_rerank(body: CohereRerankRequest, request: Request, service: ServiceDep) -> Response:
    """Cohere's rerank API (v2; the cohere SDK's ``ClientV2.rerank``): each document's relevance to the
    query, best first: ``/rerank``'s score of the pair."""
    answer, results = await _ranked(body, request, service, body.return_documents)
    meta = _meta(input_tokens=answer.value[1], search_units=math.ceil(len(body.documents) / 100))
    payload = {"id": str(uuid.uuid4()), "results": results, "meta": meta}
    return json_response(payload, answer.timings)


def embeddings_by_type(vectors: np.ndarray, types: Sequence[str]) -> dict[str, Any]:
    """Cohere's ``embeddings`` object: the float32 ``vectors`` [n, width] in each of ``types``, each
    derived from the same vectors; int8, binary, ubinary and base64 are ``/embed``'s ``encoding``
    (int8 its values, without the scale), uint8 the int8 values plus 128."""
    out: dict[str, Any] = {}
    values = None
    for kind in types:
        if kind in ("int8", "uint8"):
            if values is None:
                values = int8_vectors(vectors)[0]
            out[kind] = values if kind == "int8" else (values.astype(np.int16) + 128).astype(np.uint8)
        elif kind in ("binary", "ubinary"):
            out[kind] = binary_vectors(vectors, signed=kind == "binary")
        else:
            out[kind] = encode_vectors(vectors, "base64" if kind == "base64" else "float")
    return out


async def _embedded(
    body: CohereEmbedRequest, request: Request, service: Service
) -> Answer[tuple[np.ndarray, int]]:
    return await unless_disconnected(
        request,
        service.retrieval.embed(
            body.texts, body.input_type, body.long_text(), body.direction(), body.output_dimension
        ),
    )


@router.post(
    "/v2/embed",
    response_model=CohereEmbedResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, body=CohereErrorBody),
)
async def cohere_embed(body: CohereEmbedRequest, request: Request, service: ServiceDep) -> Response:
    """Cohere's embed API (v2; the cohere SDK's ``ClientV2.embed``): each text's vector in every
    ``embedding_types`` asked, all from one computation: ``/embed``'s vectors and encodings."""
    answer = await _embedded(body, request, service)
    vectors, tokens = answer.value
    payload = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": embeddings_by_type(vectors, body.types()),
        "texts": body.texts,
        "meta": _meta(input_tokens=tokens),
    }
    return json_response(payload, answer.timings)


@router.post("/v1/embed", responses=openapi_responses(UnknownModel, EmptyInput, body=CohereErrorBody))
async def cohere_embed_v1(body: CohereEmbedRequest, request: Request, service: ServiceDep) -> Response:
    """Cohere's embed API in v1's shape: without ``embedding_types``, ``embeddings`` is a list of float
    vectors (``embeddings_floats``); with it, as ``/v2/embed``."""
    answer = await _embedded(body, request, service)
    vectors, tokens = answer.value
    by_type = body.embedding_types is not None
    payload = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type" if by_type else "embeddings_floats",
        "embeddings": embeddings_by_type(vectors, body.types())
        if by_type
        else encode_vectors(vectors, "float"),
        "texts": body.texts,
        "meta": _meta(input_tokens=tokens),
    }
    return json_response(payload, answer.timings)


@router.post("/decode", response_model=DecodeResponse, responses=openapi_responses(UnknownModel, EmptyInput))
async def decode(body: DecodeRequest, request: Request, service: ServiceDep) -> Response:
    """text-embeddings-inference's /decode: each list of token ids as text (one list, or several)."""
    answer = await service.retrieval.decode(body.lists(), body.skip_special_tokens)
    return json_response(answer.value, answer.timings)
