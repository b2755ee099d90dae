"""text-embeddings-inference's ``tei.v1`` services on zhembed's Service.

Each call is the HTTP route's twin: its message is read into the route's own schema (the same defaults,
validation and messages), the same Service method answers, and the answer is written as TEI's message.
What a field means follows TEI: ``truncate`` false refuses an over-long input, ``normalize`` unset is the
model's default (normalised, for a plain BERT) as on TEI and ``POST /embed``, ``dimensions`` is
``POST /embed``'s (the first components, where the model was trained for it), ``truncation_direction``
right keeps the start. A field TEI declares ``optional`` is sent to the schema only when the message sets
it, so "unset" means what a JSON body without it means.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from tokenizers import Encoding as TokenEncoding

from app import __version__
from app.api.rpc import limits, wire
from app.api.rpc.calls import Calls, streaming, unary, validated
from app.api.rpc.proto import tei_pb2 as pb
from app.api.rpc.proto import tei_pb2_grpc as rpc
from app.api.schemas.embeddings import EmbedAllRequest, EmbedRequest, EmbedSparseRequest
from app.api.schemas.heads import PredictRequest, RerankRequest
from app.errors import EmptyInput, ValidationFailed
from app.tasks.options import prompt_text
from app.tasks.service import Service
from app.telemetry.timings import Timings

MODEL_TYPES = {
    "embedding": pb.MODEL_TYPE_EMBEDDING,
    "classifier": pb.MODEL_TYPE_CLASSIFIER,
    "reranker": pb.MODEL_TYPE_RERANKER,
    "tagger": pb.MODEL_TYPE_CLASSIFIER,  # TEI has no tagger type: the nearest, a classifier
}


def _direction(value: int) -> str:
    return "left" if value == pb.TRUNCATION_DIRECTION_LEFT else "right"


def _ns(ms: float) -> int:
    return max(int(ms * 1e6), 0)


def metadata(timings: Timings, chars: int = 0, tokens: int = 0) -> pb.Metadata:
    return pb.Metadata(
        compute_chars=chars,
        compute_tokens=tokens,
        total_time_ns=_ns(timings.total_ms),
        tokenization_time_ns=_ns(timings.tokenization_ms),
        queue_time_ns=_ns(timings.queue_ms),
        inference_time_ns=_ns(timings.inference_ms),
    )


def _set(request: Any, *names: str) -> dict[str, Any]:
    """The ``optional`` fields among ``names`` that ``request`` sets, as a JSON body would carry them."""
    return {name: getattr(request, name) for name in names if request.HasField(name)}


class Info(rpc.InfoServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        async def work(service: Service) -> pb.InfoResponse:
            s = service.settings
            return pb.InfoResponse(
                version=__version__,
                model_id=service.served_name,
                model_sha=service.model.manifest.source.weights_sha256 or "",
                model_dtype=service.model.variant,
                model_type=MODEL_TYPES[service.kind],
                max_concurrent_requests=s.max_concurrent_inputs,
                max_input_length=service.model.tokenizer.max_length,
                max_batch_tokens=s.max_batch_tokens,
                max_batch_requests=s.max_batch_size,
                max_client_batch_size=s.max_inputs_per_request,
                tokenization_workers=1,
            )

        return await self.calls.unary("/tei.v1.Info/Info", context, work)


class Embed(rpc.EmbedServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @staticmethod
    async def _embed(service: Service, request: pb.EmbedRequest) -> pb.EmbedResponse:
        body = validated(
            EmbedRequest,
            {
                "inputs": request.inputs,
                "truncate": request.truncate,
                "truncation_direction": _direction(request.truncation_direction),
                **_set(request, "normalize", "prompt_name", "dimensions"),
            },
        )
        answer = await service.embeddings.embed(body.inputs, body.options(service.defaults))
        vector = np.asarray(answer.value)[0]
        return pb.EmbedResponse(
            embeddings=vector.tolist(), metadata=metadata(answer.timings, len(request.inputs))
        )

    @staticmethod
    async def _embed_all(service: Service, request: pb.EmbedAllRequest) -> pb.EmbedAllResponse:
        if request.HasField("prompt_name"):
            raise ValidationFailed("prompt_name is not supported on EmbedAll: send the text with its prompt")
        body = validated(
            EmbedAllRequest,
            {
                "inputs": request.inputs,
                "truncate": request.truncate,
                "truncation_direction": _direction(request.truncation_direction),
            },
        )
        answer = await service.tokens.embed_all(body.inputs, body.options(service.defaults.long_text))
        rows = answer.value[0].vectors
        done = metadata(answer.timings, len(request.inputs), len(rows))
        return await limits.off_loop(_embed_all_response, rows, done)

    Embed = unary("/tei.v1.Embed/Embed", _embed)
    EmbedStream = streaming("/tei.v1.Embed/EmbedStream", _embed)

    EmbedAll = unary("/tei.v1.Embed/EmbedAll", _embed_all)
    EmbedAllStream = streaming("/tei.v1.Embed/EmbedAllStream", _embed_all)

    @staticmethod
    async def _sparse(service: Service, request: pb.EmbedSparseRequest) -> pb.EmbedSparseResponse:
        if request.HasField("prompt_name"):
            raise ValidationFailed(
                "prompt_name is not supported on EmbedSparse: send the text with its prompt"
            )
        body = validated(
            EmbedSparseRequest,
            {
                "inputs": request.inputs,
                "truncate": request.truncate,
                "truncation_direction": _direction(request.truncation_direction),
            },
        )
        answer = await service.sparse.embed_sparse(body.inputs, body.long_text(), body.direction())
        (vector,) = answer.value
        values = [
            pb.SparseValue(index=i, value=v)
            for i, v in zip(vector.indices.tolist(), vector.values.tolist(), strict=True)
        ]
        return pb.EmbedSparseResponse(
            sparse_embeddings=values, metadata=metadata(answer.timings, len(request.inputs))
        )

    EmbedSparse = unary("/tei.v1.Embed/EmbedSparse", _sparse)
    EmbedSparseStream = streaming("/tei.v1.Embed/EmbedSparseStream", _sparse)


def _embed_all_response(rows: np.ndarray, done: pb.Metadata) -> pb.EmbedAllResponse:
    """``EmbedAll``'s answer, built off the loop: up to the model's length × hidden size numbers, written as
    the wire format has them (each ``TokenEmbedding`` a length-delimited field 1 holding its packed
    little-endian float32s, which are the row's bytes as they are) and parsed once, in C: no Python float
    per number (5x faster than lists of them, 512 x 768: 14 ms against 74)."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    width = rows.shape[1] * 4 if rows.ndim == 2 else 0
    inner = b"\x0a" + _varint(width)  # TokenEmbedding.embeddings, packed
    outer = b"\x0a" + _varint(len(inner) + width)  # EmbedAllResponse.token_embeddings
    raw = rows.tobytes()
    parts = [b"".join((outer, inner, raw[k : k + width])) for k in range(0, len(raw), width or 1)]
    answer = pb.EmbedAllResponse.FromString(b"".join(parts))
    answer.metadata.CopyFrom(done)
    return answer


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _predictions(answer: list[dict[str, Any]]) -> list[pb.Prediction]:
    return [pb.Prediction(score=p["score"], label=p["label"]) for p in answer]


class Predict(rpc.PredictServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @staticmethod
    async def _predict(service: Service, request: Any) -> pb.PredictResponse:
        pair = isinstance(request, pb.PredictPairRequest)
        if pair and len(request.inputs) != 2:
            raise ValidationFailed(f"inputs must be a pair of two texts, not {len(request.inputs)}")
        inputs: Any = list(request.inputs) if pair else request.inputs
        body = validated(
            PredictRequest,
            {
                "inputs": inputs,
                "truncate": request.truncate,
                "raw_scores": request.raw_scores,
                "truncation_direction": _direction(request.truncation_direction),
            },
        )
        answer = await service.heads.predict(
            body.sequences(), body.raw_scores, body.long_text(), body.direction()
        )
        chars = sum(len(t) for t in (request.inputs if pair else [request.inputs]))
        return pb.PredictResponse(
            predictions=_predictions(answer.value[0]), metadata=metadata(answer.timings, chars)
        )

    Predict = unary("/tei.v1.Predict/Predict", _predict)
    PredictPair = unary("/tei.v1.Predict/PredictPair", _predict)

    PredictStream = streaming("/tei.v1.Predict/PredictStream", _predict)
    PredictPairStream = streaming("/tei.v1.Predict/PredictPairStream", _predict)


class Rerank(rpc.RerankServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @staticmethod
    async def _rerank(service: Service, request: Any, texts: list[str]) -> pb.RerankResponse:
        body = validated(
            RerankRequest,
            {
                "query": request.query,
                "texts": texts,
                "truncate": request.truncate,
                "raw_scores": request.raw_scores,
                "return_text": request.return_text,
                "truncation_direction": _direction(request.truncation_direction),
            },
        )
        answer = await service.heads.rerank(
            body.query, body.texts, body.raw_scores, body.return_text, body.long_text(), body.direction()
        )
        ranks = [
            pb.Rank(index=r["index"], score=r["score"], **({"text": r["text"]} if "text" in r else {}))
            for r in answer.value
        ]
        chars = len(request.query) * len(texts) + sum(len(t) for t in texts)
        return pb.RerankResponse(ranks=ranks, metadata=metadata(answer.timings, chars))

    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        return await self.calls.unary(
            "/tei.v1.Rerank/Rerank", context, lambda s: self._rerank(s, request, list(request.texts))
        )

    async def RerankStream(
        self, request_iterator: AsyncIterator[pb.RerankStreamRequest], context: grpc.aio.ServicerContext
    ) -> pb.RerankResponse:
        # The texts of every message, ranked against the first message's query with its options; read
        # within the call, so that one message that does not parse is refused as the call's error, and only
        # up to the request limits (:func:`limits.stream_texts`).
        async def work(service: Service) -> pb.RerankResponse:
            first, texts = await limits.stream_texts(request_iterator, service.settings)
            if first is None:
                raise EmptyInput("the stream sent no texts: send at least one RerankStreamRequest")
            return await self._rerank(service, first, texts)

        return await self.calls.unary("/tei.v1.Rerank/RerankStream", context, work)


def _encode_response(encoding: TokenEncoding) -> pb.EncodeResponse:
    """``Tokenize``'s answer: each token's id, text, whether special, and character span (built off the
    loop: thousands of messages for the longest input)."""
    return pb.EncodeResponse(
        tokens=[
            pb.SimpleToken(id=i, text=text, special=bool(special), start=start, stop=stop)
            for i, text, special, (start, stop) in zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
            )
        ]
    )


class Tokenize(rpc.TokenizeServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @staticmethod
    async def _tokenize(service: Service, request: pb.EncodeRequest) -> pb.EncodeResponse:
        prompt = None
        if request.HasField("prompt_name"):
            prompt = prompt_text(request.prompt_name, service.model.manifest.defaults.prompts)
        text = (prompt or "") + request.inputs
        return await limits.tokenized(service, text, request.add_special_tokens, _encode_response)

    @staticmethod
    async def _decode(service: Service, request: pb.DecodeRequest) -> pb.DecodeResponse:
        text = await limits.decoded(service, request.ids, request.skip_special_tokens)
        return pb.DecodeResponse(text=text)

    Tokenize = unary("/tei.v1.Tokenize/Tokenize", _tokenize)
    TokenizeStream = streaming("/tei.v1.Tokenize/TokenizeStream", _tokenize)

    Decode = unary("/tei.v1.Tokenize/Decode", _decode)
    DecodeStream = streaming("/tei.v1.Tokenize/DecodeStream", _decode)


def add_to(server: grpc.aio.Server, calls: Calls) -> list[str]:
    """Add every tei.v1 service to ``server`` (requests read by :mod:`app.api.rpc.wire`); their full
    names (for reflection and health)."""
    servicers = {
        "Info": Info(calls),
        "Embed": Embed(calls),
        "Predict": Predict(calls),
        "Rerank": Rerank(calls),
        "Tokenize": Tokenize(calls),
    }
    return [
        wire.register(server, calls, servicer, pb.DESCRIPTOR.services_by_name[name])
        for name, servicer in servicers.items()
    ]
