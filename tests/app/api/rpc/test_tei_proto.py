"""Our ``tei.v1`` proto against text-embeddings-inference's own, written down here as data.

The tables are TEI's ``proto/tei.proto`` at commit 0d124dc (2026-07-24, release 1.9.3), field for field:
each message's fields as (name, number, type, label), each enum's values, each service's methods with
their streaming. They are compared with the descriptor that our generated ``tei_pb2`` carries (what the
server registers and reflection serves), read in a process of its own: the test's generated client
(test_grpc.py) and the server's modules cannot meet in one descriptor pool.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[4]

# label: "" (singular), "optional" (proto3 explicit presence), "repeated". type: the scalar's name, or the
# message's or enum's name within tei.v1.
Field = tuple[str, int, str, str]

MESSAGES: dict[str, list[Field]] = {
    "InfoRequest": [],
    "InfoResponse": [
        ("version", 1, "string", ""),
        ("sha", 2, "string", "optional"),
        ("docker_label", 3, "string", "optional"),
        ("model_id", 4, "string", ""),
        ("model_sha", 5, "string", "optional"),
        ("model_dtype", 6, "string", ""),
        ("model_type", 7, "ModelType", ""),
        ("max_concurrent_requests", 8, "uint32", ""),
        ("max_input_length", 9, "uint32", ""),
        ("max_batch_tokens", 10, "uint32", ""),
        ("max_batch_requests", 11, "uint32", "optional"),
        ("max_client_batch_size", 12, "uint32", ""),
        ("tokenization_workers", 13, "uint32", ""),
    ],
    "Metadata": [
        ("compute_chars", 1, "uint32", ""),
        ("compute_tokens", 2, "uint32", ""),
        ("total_time_ns", 3, "uint64", ""),
        ("tokenization_time_ns", 4, "uint64", ""),
        ("queue_time_ns", 5, "uint64", ""),
        ("inference_time_ns", 6, "uint64", ""),
    ],
    "EmbedRequest": [
        ("inputs", 1, "string", ""),
        ("truncate", 2, "bool", ""),
        ("normalize", 3, "bool", "optional"),
        ("truncation_direction", 4, "TruncationDirection", ""),
        ("prompt_name", 5, "string", "optional"),
        ("dimensions", 6, "uint32", "optional"),
    ],
    "EmbedResponse": [
        ("embeddings", 1, "float", "repeated"),
        ("metadata", 2, "Metadata", ""),
    ],
    "EmbedSparseRequest": [
        ("inputs", 1, "string", ""),
        ("truncate", 2, "bool", ""),
        ("truncation_direction", 3, "TruncationDirection", ""),
        ("prompt_name", 4, "string", "optional"),
    ],
    "SparseValue": [
        ("index", 1, "uint32", ""),
        ("value", 2, "float", ""),
    ],
    "EmbedSparseResponse": [
        ("sparse_embeddings", 1, "SparseValue", "repeated"),
        ("metadata", 2, "Metadata", ""),
    ],
    "EmbedAllRequest": [
        ("inputs", 1, "string", ""),
        ("truncate", 2, "bool", ""),
        ("truncation_direction", 3, "TruncationDirection", ""),
        ("prompt_name", 4, "string", "optional"),
    ],
    "TokenEmbedding": [
        ("embeddings", 1, "float", "repeated"),
    ],
    "EmbedAllResponse": [
        ("token_embeddings", 1, "TokenEmbedding", "repeated"),
        ("metadata", 2, "Metadata", ""),
    ],
    "PredictRequest": [
        ("inputs", 1, "string", ""),
        ("truncate", 2, "bool", ""),
        ("raw_scores", 3, "bool", ""),
        ("truncation_direction", 4, "TruncationDirection", ""),
    ],
    "PredictPairRequest": [
        ("inputs", 1, "string", "repeated"),
        ("truncate", 2, "bool", ""),
        ("raw_scores", 3, "bool", ""),
        ("truncation_direction", 4, "TruncationDirection", ""),
    ],
    "Prediction": [
        ("score", 1, "float", ""),
        ("label", 2, "string", ""),
    ],
    "PredictResponse": [
        ("predictions", 1, "Prediction", "repeated"),
        ("metadata", 2, "Metadata", ""),
    ],
    "RerankRequest": [
        ("query", 1, "string", ""),
        ("texts", 2, "string", "repeated"),
        ("truncate", 3, "bool", ""),
        ("raw_scores", 4, "bool", ""),
        ("return_text", 5, "bool", ""),
        ("truncation_direction", 6, "TruncationDirection", ""),
    ],
    "RerankStreamRequest": [
        ("query", 1, "string", ""),
        ("text", 2, "string", ""),
        ("truncate", 3, "bool", ""),
        ("raw_scores", 4, "bool", ""),
        ("return_text", 5, "bool", ""),
        ("truncation_direction", 6, "TruncationDirection", ""),
    ],
    "Rank": [
        ("index", 1, "uint32", ""),
        ("text", 2, "string", "optional"),
        ("score", 3, "float", ""),
    ],
    "RerankResponse": [
        ("ranks", 1, "Rank", "repeated"),
        ("metadata", 2, "Metadata", ""),
    ],
    "EncodeRequest": [
        ("inputs", 1, "string", ""),
        ("add_special_tokens", 2, "bool", ""),
        ("prompt_name", 3, "string", "optional"),
    ],
    "SimpleToken": [
        ("id", 1, "uint32", ""),
        ("text", 2, "string", ""),
        ("special", 3, "bool", ""),
        ("start", 4, "uint32", "optional"),
        ("stop", 5, "uint32", "optional"),
    ],
    "EncodeResponse": [
        ("tokens", 1, "SimpleToken", "repeated"),
    ],
    "DecodeRequest": [
        ("ids", 1, "uint32", "repeated"),
        ("skip_special_tokens", 2, "bool", ""),
    ],
    "DecodeResponse": [
        ("text", 1, "string", ""),
    ],
}

ENUMS: dict[str, list[tuple[str, int]]] = {
    "ModelType": [("MODEL_TYPE_EMBEDDING", 0), ("MODEL_TYPE_CLASSIFIER", 1), ("MODEL_TYPE_RERANKER", 2)],
    "TruncationDirection": [("TRUNCATION_DIRECTION_RIGHT", 0), ("TRUNCATION_DIRECTION_LEFT", 1)],
}

# method: (request, response, client streams, server streams)
SERVICES: dict[str, dict[str, tuple[str, str, bool, bool]]] = {
    "Info": {"Info": ("InfoRequest", "InfoResponse", False, False)},
    "Embed": {
        "Embed": ("EmbedRequest", "EmbedResponse", False, False),
        "EmbedStream": ("EmbedRequest", "EmbedResponse", True, True),
        "EmbedSparse": ("EmbedSparseRequest", "EmbedSparseResponse", False, False),
        "EmbedSparseStream": ("EmbedSparseRequest", "EmbedSparseResponse", True, True),
        "EmbedAll": ("EmbedAllRequest", "EmbedAllResponse", False, False),
        "EmbedAllStream": ("EmbedAllRequest", "EmbedAllResponse", True, True),
    },
    "Predict": {
        "Predict": ("PredictRequest", "PredictResponse", False, False),
        "PredictPair": ("PredictPairRequest", "PredictResponse", False, False),
        "PredictStream": ("PredictRequest", "PredictResponse", True, True),
        "PredictPairStream": ("PredictPairRequest", "PredictResponse", True, True),
    },
    "Rerank": {
        "Rerank": ("RerankRequest", "RerankResponse", False, False),
        "RerankStream": ("RerankStreamRequest", "RerankResponse", True, False),
    },
    "Tokenize": {
        "Tokenize": ("EncodeRequest", "EncodeResponse", False, False),
        "TokenizeStream": ("EncodeRequest", "EncodeResponse", True, True),
        "Decode": ("DecodeRequest", "DecodeResponse", False, False),
        "DecodeStream": ("DecodeRequest", "DecodeResponse", True, True),
    },
}

# TEI's one method option: Info is idempotent.
IDEMPOTENT = {("Info", "Info")}

_SCALARS = {
    number: name.removeprefix("TYPE_").lower()
    for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()
}
_REFERENCES = (
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
    descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
)


@pytest.fixture(scope="module")
def ours() -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor our generated tei_pb2 registers, read in a process of its own."""
    code = (
        "import base64, sys\n"
        "from app.api.rpc.proto import tei_pb2\n"
        "sys.stdout.write(base64.b64encode(tei_pb2.DESCRIPTOR.serialized_pb).decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(done.stdout))


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type in _REFERENCES:
        package, _, name = field.type_name.lstrip(".").rpartition(".")
        assert package == "tei.v1", field.type_name
        return name
    return _SCALARS[field.type]


def _label(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return "repeated"
    return "optional" if field.proto3_optional else ""


def test_package_and_syntax(ours: descriptor_pb2.FileDescriptorProto) -> None:
    assert ours.package == "tei.v1" and ours.syntax == "proto3"


def test_every_message_has_teis_fields_names_numbers_types_and_labels(
    ours: descriptor_pb2.FileDescriptorProto,
) -> None:
    got = {
        m.name: sorted((f.name, f.number, _type(f), _label(f)) for f in m.field) for m in ours.message_type
    }
    assert got == {name: sorted(fields) for name, fields in MESSAGES.items()}
    assert not any(m.nested_type or m.enum_type or m.extension for m in ours.message_type)


def test_every_enum_has_teis_values(ours: descriptor_pb2.FileDescriptorProto) -> None:
    assert {e.name: [(v.name, v.number) for v in e.value] for e in ours.enum_type} == ENUMS


def test_every_service_has_teis_methods_and_streaming(ours: descriptor_pb2.FileDescriptorProto) -> None:
    got = {
        s.name: {
            m.name: (
                m.input_type.removeprefix(".tei.v1."),
                m.output_type.removeprefix(".tei.v1."),
                m.client_streaming,
                m.server_streaming,
            )
            for m in s.method
        }
        for s in ours.service
    }
    assert got == SERVICES
    idempotent = {
        (s.name, m.name)
        for s in ours.service
        for m in s.method
        if m.options.idempotency_level == descriptor_pb2.MethodOptions.IDEMPOTENT
    }
    assert idempotent == IDEMPOTENT
