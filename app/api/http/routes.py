"""Thin routes: parse → call the service → serialise. Errors come from the service as typed
exceptions and become HTTP through :mod:`app.api.errors`; each route's OpenAPI errors come from there too."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any, Protocol

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from app.api.encoding import encode_rows, encode_vectors, sparse_json
from app.api.errors import openapi_responses
from app.api.http.disconnect import unless_disconnected
from app.api.http.pieces import json_pieces
from app.api.schemas.embeddings import (
    EmbedAllRequest,
    EmbedAllResponse,
    EmbedRequest,
    EmbedResponse,
    EmbedSparseRequest,
    EmbedSparseResponse,
    RootRequest,
    SimilarityInputs,
    SimilarityRequest,
)
from app.api.schemas.fill_mask import FillMaskRequest, FillMaskResponse
from app.api.schemas.heads import (
    PredictRequest,
    PredictResponse,
    RerankRequest,
    RerankResponse,
    TokenClassificationRequest,
    TokenClassificationResponse,
)
from app.api.schemas.tokenize import TokenizeRequest, TokenizeResponse
from app.errors import EmptyInput, NotReady, Unavailable, UnknownModel, Unsupported, ValidationFailed
from app.model.tokenizer import TextInput
from app.tasks.info import describe_all
from app.tasks.models import Models
from app.tasks.options import FloatEncoding
from app.tasks.service import Service, Timings, TokenVectors, fault_of
from app.telemetry.metrics import CONTENT_TYPE, Metrics

router = APIRouter()


class Workers(Protocol):
    """What the routes read of the server this process is one worker of: its
    :class:`app.serving.cluster.Cluster`, declared here so that the API imports nothing of the processes
    that start it."""

    index: int
    size: int

    def ready_count(self) -> int: ...

    def all_ready(self) -> bool: ...


def loaded(request: Request, name: str) -> Any:
    """What the lifespan put on the app's state as ``name``, once the model has loaded."""
    value = getattr(request.app.state, name, None)
    if value is None:
        raise NotReady("the model is still loading")
    return value


# async: a plain `def` dependency would run on AnyIO's thread pool, a thread hop on every request.
async def get_service(request: Request) -> Service:
    service: Service = loaded(request, "service")
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_models(request: Request) -> Models:
    """Every model the service serves (a data route's is chosen on the data path: :mod:`app.api.http.fast`)."""
    models: Models = loaded(request, "models")
    return models


ModelsDep = Annotated[Models, Depends(get_models)]


def timing_headers(timings: Timings) -> list[tuple[bytes, bytes]]:
    """The ``x-*-time`` headers: milliseconds the request spent in each stage (TEI's names)."""
    return [
        (b"x-queue-time", b"%.3f" % timings.queue_ms),
        (b"x-tokenization-time", b"%.3f" % timings.tokenization_ms),
        (b"x-inference-time", b"%.3f" % timings.inference_ms),
        (b"x-total-time", b"%.3f" % timings.total_ms),
    ]


class JSONAnswer(Response):
    """A JSON body with its headers already as ASGI's byte pairs: no header assembly by Starlette on
    every request. FastAPI sends it as it sends any Response; the data path (:mod:`app.api.http.fast`) sends
    ``status_code``, ``raw_headers`` and ``body`` as ASGI messages itself."""

    media_type = "application/json"

    def __init__(self, body: bytes, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = raw_headers


_CONTENT_TYPE = (b"content-type", b"application/json")


def json_response(payload: Any, timings: Timings | None = None) -> JSONAnswer:
    """``payload`` as JSON; numpy arrays in it are written natively (float32 in its shortest form).

    The headers as Starlette would write them, in its order: the timings, then length and type.
    """
    return json_body(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), timings)


async def json_response_aside(payload: Any, timings: Timings | None = None) -> JSONAnswer:
    """:func:`json_response` for an answer that may be large (megabytes): encoded on a thread, a piece at
    a time (:func:`~app.api.http.pieces.json_pieces`), so the event loop serves others meanwhile."""
    return json_body(await asyncio.to_thread(json_pieces, payload), timings)


def json_body(body: bytes, timings: Timings | None = None) -> JSONAnswer:
    """``body``, JSON already, with the headers of :func:`json_response`."""
    headers = timing_headers(timings) if timings is not None else []
    headers.append((b"content-length", b"%d" % len(body)))
    headers.append(_CONTENT_TYPE)
    return JSONAnswer(body, headers)


def token_vectors_payload(answer: TokenVectors, encoding: FloatEncoding) -> Any:
    """One input's /embed_all answer: its token vectors (TEI's shape), or with ``return_tokens`` or
    ``norms`` ``{"vectors": [...], "tokens": [...], "norms": [...]}`` (only the parts asked for)."""
    vectors = encode_rows(answer.vectors, encoding)
    if answer.tokens is None and answer.norms is None:
        return vectors
    entry: dict[str, Any] = {"vectors": vectors}
    if answer.tokens is not None:
        entry["tokens"] = answer.tokens
    if answer.norms is not None:
        entry["norms"] = answer.norms.tolist()
    return entry


@router.post(
    "/embed", response_model=EmbedResponse, responses=openapi_responses(UnknownModel, EmptyInput, Unsupported)
)
async def embed(body: EmbedRequest, request: Request, service: ServiceDep) -> Response:
    """One vector per input, in input order."""
    answer = await unless_disconnected(
        request, service.embeddings.embed(body.inputs, body.options(service.defaults))
    )
    return json_response(encode_vectors(answer.value, body.encoding), answer.timings)


@router.post(
    "/",
    # Vectors or similarity scores; for a fine-tuned head, /predict's or /token-classification's answer.
    response_model=EmbedResponse | list[float] | PredictResponse | TokenClassificationResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def root(body: RootRequest, request: Request, service: ServiceDep) -> Response:
    """text-embeddings-inference's root route, which Hugging Face's InferenceClient posts to when given
    the server's URL. For an embedding model, ``inputs`` as texts answer as /embed does (same options),
    ``{source_sentence, sentences}`` as /similarity does (a score per sentence). For a fine-tuned head,
    texts answer as the head's route: /predict (a classifier or reranker: a string, or a list of
    strings each classified alone) or /token-classification (a tagger, aggregation "simple")."""
    if service.kind != "embedding" and not isinstance(body.inputs, SimilarityInputs):
        if service.kind == "tagger":
            entities = await unless_disconnected(
                request, service.heads.token_classification(body.inputs, "simple", ["O"], "error", "right")
            )
            return json_response(entities.value, entities.timings)
        texts: list[TextInput] = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        predicted = await unless_disconnected(request, service.heads.predict(texts, False, "error", "right"))
        value = predicted.value[0] if isinstance(body.inputs, str) else predicted.value
        return json_response(value, predicted.timings)
    if isinstance(body.inputs, SimilarityInputs):
        scores = await unless_disconnected(
            request,
            service.embeddings.similarity(
                body.inputs.source_sentence, body.inputs.sentences, None, body.options(service.defaults)
            ),
        )
        return json_response(scores.value, scores.timings)
    answer = await unless_disconnected(
        request, service.embeddings.embed(body.inputs, body.options(service.defaults))
    )
    return json_response(encode_vectors(answer.value, body.encoding), answer.timings)


@router.post(
    "/embed_sparse",
    response_model=EmbedSparseResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def embed_sparse(body: EmbedSparseRequest, request: Request, service: ServiceDep) -> Response:
    """Per input its sparse (SPLADE) vector: a weight per vocabulary entry, the zero ones left out."""
    answer = await unless_disconnected(
        request, service.sparse.embed_sparse(body.inputs, body.long_text(), body.direction(), body.top_k)
    )
    # Up to 64 vectors of a weight per vocabulary entry: encoded off the event loop, a vector per call.
    return json_body(await asyncio.to_thread(sparse_json, answer.value), answer.timings)


@router.post(
    "/embed_all", response_model=EmbedAllResponse, responses=openapi_responses(UnknownModel, EmptyInput)
)
async def embed_all(body: EmbedAllRequest, request: Request, service: ServiceDep) -> Response:
    """Per input, the vector of each of its tokens, in order (optionally with the tokens and norms)."""
    answer = await unless_disconnected(
        request, service.tokens.embed_all(body.inputs, body.options(service.defaults.long_text))
    )
    # Up to max_embed_all_tokens vectors (33 MB of JSON at 4,096 × 768): encoded off the event loop.
    return await json_response_aside(
        [token_vectors_payload(a, body.encoding) for a in answer.value], answer.timings
    )


@router.post(
    "/similarity",
    response_model=list[float],
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def similarity(body: SimilarityRequest, request: Request, service: ServiceDep) -> Response:
    """Cosine of source_sentence with each sentence, or one score per pair."""
    source = body.inputs.source_sentence if body.inputs else None
    sentences = body.inputs.sentences if body.inputs else None
    answer = await unless_disconnected(
        request, service.embeddings.similarity(source, sentences, body.pairs, body.options(service.defaults))
    )
    return json_response(answer.value, answer.timings)


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def predict(body: PredictRequest, request: Request, service: ServiceDep) -> Response:
    """text-embeddings-inference's /predict, for a sequence classifier (or a cross-encoder): every label
    with its score, best first, per input. An input is a string or a pair ``[text, text_pair]``; a list
    of them is a batch (a list of exactly two strings is one pair, as in TEI)."""
    answer = await unless_disconnected(
        request, service.heads.predict(body.sequences(), body.raw_scores, body.long_text(), body.direction())
    )
    return json_response(answer.value[0] if body.single() else answer.value, answer.timings)


@router.post(
    "/rerank",
    response_model=RerankResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def rerank(body: RerankRequest, request: Request, service: ServiceDep) -> Response:
    """text-embeddings-inference's /rerank, for a cross-encoder: each text's score against the query,
    best first, with its index in ``texts`` (and the text with ``return_text``)."""
    answer = await unless_disconnected(
        request,
        service.heads.rerank(
            body.query, body.texts, body.raw_scores, body.return_text, body.long_text(), body.direction()
        ),
    )
    return json_response(answer.value, answer.timings)


@router.post(
    "/token-classification",
    response_model=TokenClassificationResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def token_classification(
    body: TokenClassificationRequest, request: Request, service: ServiceDep
) -> Response:
    """Named entities (or each token's label), in the shape of transformers' token-classification pipeline
    and Hugging Face's InferenceClient.token_classification: a string's entities, or per input of a list."""
    if body.parameters is not None and body.parameters.stride:
        raise ValidationFailed("parameters.stride is not supported: send texts within the model's length")
    answer = await unless_disconnected(
        request,
        service.heads.token_classification(
            body.inputs, body.strategy(), body.ignored(), body.long_text(), body.direction()
        ),
    )
    return await json_response_aside(answer.value, answer.timings)


@router.post(
    "/fill-mask",
    response_model=FillMaskResponse,
    responses=openapi_responses(UnknownModel, EmptyInput, Unsupported),
)
async def fill_mask(body: FillMaskRequest, request: Request, service: ServiceDep) -> Response:
    """The top_k predictions for each [MASK], in the shapes of transformers' fill-mask pipeline: for a
    string, its candidates (one [MASK]) or a list per mask; for a list of inputs, one such answer each."""
    answer = await unless_disconnected(
        request, service.fill_mask.fill(body.inputs, body.wanted_top_k(), body.target_list())
    )
    # Up to 128 masks × top_k 50 candidates, each with its whole sequence: megabytes of JSON.
    return await json_response_aside(answer.value, answer.timings)


@router.post(
    "/tokenize", response_model=TokenizeResponse, responses=openapi_responses(UnknownModel, EmptyInput)
)
async def tokenize(body: TokenizeRequest, request: Request, service: ServiceDep) -> Response:
    """Tokens with ids and character offsets, per input (at most ``max_tokenize_tokens`` in all)."""
    answer = await unless_disconnected(request, service.tokens.tokenize(body.inputs, body.add_special_tokens))
    return await json_response_aside(answer.value, answer.timings)


def _fault(request: Request) -> None:
    """Raise :class:`~app.errors.Unavailable` with why, once a model of this process cannot serve."""
    models: Models | None = getattr(request.app.state, "models", None)
    if models is not None and (reason := fault_of(models.services)) is not None:
        raise Unavailable(reason)


@router.get("/health", responses=openapi_responses(Unavailable))
async def health(request: Request) -> Response:
    """Liveness: the process answers and can serve; 503, with why, once a model's warm-up failed or its
    inference thread died (the process then stops, exit status 1, to be replaced)."""
    _fault(request)
    return json_response({"status": "ok"})


@router.get("/ready", responses=openapi_responses(NotReady))
async def ready(request: Request, models: ModelsDep) -> Response:
    """Readiness: every model is loaded and warmed up (in every worker, when there are several), and
    none has failed (:func:`health`)."""
    _fault(request)
    if not models.ready:
        raise NotReady("the model is still warming up")
    cluster: Workers | None = request.app.state.cluster
    if cluster is not None and not cluster.all_ready():
        raise NotReady(f"{cluster.ready_count()} of {cluster.size} workers are ready")
    return json_response({"ready": True})


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus metrics, all named ``zhembed_*``."""
    registry: Metrics = request.app.state.metrics
    return Response(registry.exposition(), media_type=CONTENT_TYPE)


@router.get("/info")
async def info(request: Request, models: ModelsDep) -> Response:
    """The model, variant, provider, limits, batching settings and engine counters (of the worker that
    answers, when there are several: ``worker`` says which): the default model's at the top, every
    model's under ``models``, and which one each route answers with when a request names none."""
    cluster: Workers | None = request.app.state.cluster
    worker = {"index": cluster.index, "of": cluster.size} if cluster is not None else {"index": 0, "of": 1}
    return json_response({**describe_all(models), "worker": {**worker, "pid": os.getpid()}})
