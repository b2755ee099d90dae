"""``zhembed.v1``: what tei.v1 cannot say (layers, pooling, layer combinations, int8 vectors, similarity,
fill-mask), each call the twin of its HTTP route, read through that route's schema."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from app.api.encoding import binary_vectors, encode_vectors
from app.api.rpc import limits, wire
from app.api.rpc.calls import Calls, streaming, unary, validated
from app.api.rpc.proto import zhembed_pb2 as pb
from app.api.rpc.proto import zhembed_pb2_grpc as rpc
from app.api.schemas.embeddings import EmbedRequest, SimilarityRequest
from app.api.schemas.fill_mask import FillMaskRequest
from app.errors import ValidationFailed
from app.tasks.service import Service
from app.telemetry.timings import Timings


def options(message: pb.EmbedOptions) -> dict[str, Any]:
    """The HTTP body's option fields that the message sets (unset ones take the model's defaults)."""
    fields: dict[str, Any] = {
        name: getattr(message, name)
        for name in ("pooling", "layer_combine", "long_text", "truncation_direction", "prompt_name")
        if message.HasField(name)
    }
    if message.layers:
        fields["layers"] = list(message.layers)
    if message.layer_weights:
        fields["layer_weights"] = list(message.layer_weights)
    return fields


def timings(t: Timings) -> pb.Timings:
    return pb.Timings(
        queue_ms=t.queue_ms,
        tokenization_ms=t.tokenization_ms,
        inference_ms=t.inference_ms,
        total_ms=t.total_ms,
    )


# zhembed.v1.Encoding's values, each as the HTTP routes name it.
ENCODINGS = {
    pb.ENCODING_FLOAT: "float",
    pb.ENCODING_INT8: "int8",
    pb.ENCODING_UBINARY: "ubinary",
    pb.ENCODING_BINARY: "binary",
}


def vectors(matrix: np.ndarray, encoding: int) -> list[pb.Vector]:
    if encoding in (pb.ENCODING_UBINARY, pb.ENCODING_BINARY):
        packed = binary_vectors(np.asarray(matrix, dtype=np.float32), signed=encoding == pb.ENCODING_BINARY)
        return [pb.Vector(packed=row.tobytes()) for row in packed]
    if encoding == pb.ENCODING_INT8:
        encoded: list[Any] = list(encode_vectors(matrix, "int8"))
        return [
            pb.Vector(int8=np.asarray(v["values"], dtype=np.int8).tobytes(), scale=float(v["scale"]))
            for v in encoded
        ]
    return [pb.Vector(values=row) for row in np.asarray(matrix, dtype=np.float32).tolist()]


class Zhembed(rpc.ZhembedServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @staticmethod
    async def _embed(service: Service, request: pb.EmbedRequest) -> pb.EmbedResponse:
        fields = {"inputs": list(request.inputs), **options(request.options)}
        fields.update({n: getattr(request, n) for n in ("normalize", "dimensions") if request.HasField(n)})
        body = validated(EmbedRequest, fields)
        if request.encoding not in ENCODINGS:  # before the work: a number this server does not know
            known = ", ".join(f"{n} ({name})" for n, name in ENCODINGS.items())
            raise ValidationFailed(
                f"encoding {request.encoding} is not one of zhembed.v1.Encoding's: {known}"
            )
        answer = await service.embeddings.embed(body.inputs, body.options(service.defaults))
        return pb.EmbedResponse(
            vectors=vectors(np.asarray(answer.value), request.encoding), timings=timings(answer.timings)
        )

    Embed = unary("/zhembed.v1.Zhembed/Embed", _embed)
    EmbedStream = streaming("/zhembed.v1.Zhembed/EmbedStream", _embed)

    async def Similarity(
        self, request: pb.SimilarityRequest, context: grpc.aio.ServicerContext
    ) -> pb.SimilarityResponse:
        async def work(service: Service) -> pb.SimilarityResponse:
            fields: dict[str, Any] = options(request.options)
            if request.pairs:
                fields["pairs"] = [[p.a, p.b] for p in request.pairs]
            else:
                fields["inputs"] = {
                    "source_sentence": request.source_sentence,
                    "sentences": list(request.sentences),
                }
            body = validated(SimilarityRequest, fields)
            source = body.inputs.source_sentence if body.inputs else None
            sentences = body.inputs.sentences if body.inputs else None
            answer = await service.embeddings.similarity(
                source, sentences, body.pairs, body.options(service.defaults)
            )
            return pb.SimilarityResponse(scores=answer.value, timings=timings(answer.timings))

        return await self.calls.unary("/zhembed.v1.Zhembed/Similarity", context, work)

    async def FillMask(
        self, request: pb.FillMaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.FillMaskResponse:
        async def work(service: Service) -> pb.FillMaskResponse:
            fields: dict[str, Any] = {"inputs": list(request.inputs)}
            if request.top_k:
                fields["top_k"] = request.top_k
            if request.targets:
                fields["parameters"] = {"targets": list(request.targets)}
            body = validated(FillMaskRequest, fields)
            answer = await service.fill_mask.fill(body.inputs, body.wanted_top_k(), body.target_list())
            # Off the loop: up to 128 masks × 50 candidates, a message each.
            return await limits.off_loop(_fill_mask_response, answer.value, timings(answer.timings))

        return await self.calls.unary("/zhembed.v1.Zhembed/FillMask", context, work)


def _fill_mask_response(value: list[Any], done: pb.Timings) -> pb.FillMaskResponse:
    """FillMask's answer: per input, per mask (one mask: its candidates; several: a list of them per
    mask), each candidate's score, token and text."""
    per_input = []
    for masks in value:
        lists = [masks] if masks and isinstance(masks[0], dict) else masks
        per_input.append(
            pb.MaskAnswer(
                masks=[
                    pb.Mask(
                        candidates=[
                            pb.Candidate(
                                score=c["score"],
                                token=c["token"],
                                token_str=c["token_str"],
                                sequence=c["sequence"],
                            )
                            for c in candidates
                        ]
                    )
                    for candidates in lists
                ]
            )
        )
    return pb.FillMaskResponse(answers=per_input, timings=done)


def add_to(server: grpc.aio.Server, calls: Calls) -> list[str]:
    """Add zhembed.v1 to ``server`` (requests read by :mod:`app.api.rpc.wire`); its full name."""
    return [wire.register(server, calls, Zhembed(calls), pb.DESCRIPTOR.services_by_name["Zhembed"])]
