"""Reading request messages: what a message that does not parse is told, in the client's terms.

First the reader alone, on messages of the project's protos loaded into a descriptor pool of this test's
own (the default pool is the generated client's: see conftest.py); then raw bytes through a generic call
(no serializer: the bytes go as they are) to ``python -m app``, on every kind of method.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from app.api.rpc.wire import MAX_DEPTH, Unreadable, reader
from tests.app.api.rpc.conftest import PROTOS
from tests.app.api.rpc.grpc_process import Server

# What no status detail may carry: Python's names for its own types.
PYTHON_NAMES = re.compile(r"<class|Error\b|Exception|Traceback|google\.|\bbytes\b'")


@pytest.fixture(scope="module")
def messages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tei.v1 and zhembed.v1 message classes by full name, from a private pool."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("descriptors") / "protos.pb"
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{PROTOS}",
                f"--descriptor_set_out={out}",
                str(PROTOS / "tei.proto"),
                str(PROTOS / "zhembed.proto"),
            ]
        )
        == 0
    )
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes()).file:
        pool.Add(file)
    names = [
        "tei.v1.EmbedRequest",
        "tei.v1.RerankRequest",
        "tei.v1.DecodeRequest",
        "zhembed.v1.SimilarityRequest",
        "zhembed.v1.EmbedRequest",
    ]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names}


def _refusal(message_class: Any, raw: bytes) -> str:
    read = reader(message_class)(raw)
    assert isinstance(read, Unreadable), read
    assert not PYTHON_NAMES.search(read.message), read.message
    return read.message


def test_a_message_that_parses_is_read_as_protobuf_reads_it(messages: dict[str, Any]) -> None:
    embed = messages["tei.v1.EmbedRequest"]
    sent = embed(inputs="你好", normalize=False, dimensions=16)
    assert reader(embed)(sent.SerializeToString()) == sent
    # Unknown fields, and an unknown group, are skipped as protobuf skips them.
    extra = sent.SerializeToString() + b"\xb8\x06\x05" + b"\xc3\x06\x08\x01\xc4\x06"
    got = reader(embed)(extra)
    assert isinstance(got, embed)
    got.DiscardUnknownFields()
    assert got == sent
    assert reader(embed)(b"") == embed()


def test_bytes_that_are_not_protobuf_say_where_the_wire_format_breaks(messages: dict[str, Any]) -> None:
    embed = messages["tei.v1.EmbedRequest"]
    head = "the request is not a valid tei.v1.EmbedRequest message: "
    assert (
        _refusal(embed, b"\xff\xff\xff")
        == head + "at byte 0, the message ends inside a field's key (a varint)"
    )
    assert _refusal(embed, b"\x0a\x05ab") == (
        head + "at byte 0, field inputs (1) is 5 bytes long and the message has 2 bytes left"
    )
    assert _refusal(embed, b"\x00") == head + "at byte 0, a field has number 0, which no field can have"
    assert _refusal(embed, b"\x08\x01\x0f") == (
        head + "at byte 2, field inputs (1) has wire type 7, which does not exist"
    )
    assert _refusal(embed, b"\x1b\x0a\x01a") == head + "the message ends inside group 3"
    assert _refusal(embed, b"\x80" * 11) == head + "at byte 0, a field's key (a varint) runs over 10 bytes"


def test_a_string_that_is_not_utf8_is_named_by_its_field(messages: dict[str, Any]) -> None:
    message = _refusal(messages["tei.v1.EmbedRequest"], b"\x0a\x03a\xff\xfe")
    assert message == (
        "the request is not a valid tei.v1.EmbedRequest message: field inputs (1) is not valid UTF-8: byte "
        "0xff at offset 1 of its 3 bytes (byte 3 of the message); send text as UTF-8"
    )
    rerank = messages["tei.v1.RerankRequest"](query="q", texts=["a", "b"]).SerializeToString()
    assert "field texts[1] (2) is not valid UTF-8" in _refusal(
        messages["tei.v1.RerankRequest"], rerank[:-1] + b"\xff"
    )
    similarity = messages["zhembed.v1.SimilarityRequest"]
    pair = messages["zhembed.v1.SimilarityRequest"].DESCRIPTOR.fields_by_name["pairs"].message_type
    pairs = similarity(pairs=[{"a": "x", "b": "y"}, {"a": "u", "b": "v"}]).SerializeToString()
    assert pair.full_name == "zhembed.v1.Pair"
    assert "field pairs[1].b (2) is not valid UTF-8" in _refusal(similarity, pairs[:-1] + b"\xc3")
    options = messages["zhembed.v1.EmbedRequest"](options={"pooling": "cls"}).SerializeToString()
    assert "field options.pooling (1) is not valid UTF-8" in _refusal(
        messages["zhembed.v1.EmbedRequest"], options[:-1] + b"\x80"
    )


def test_what_the_scan_cannot_place_is_told_in_protobufs_words(messages: dict[str, Any]) -> None:
    # A packed list of ids whose last varint is cut off: the scan reads the list as one field's bytes.
    message = _refusal(messages["tei.v1.DecodeRequest"], b"\x0a\x02\x05\xff")
    assert message == "the request is not a valid tei.v1.DecodeRequest message: Wire format was corrupt"


def test_groups_nested_past_protobufs_limit_are_refused_without_recursing_further(
    messages: dict[str, Any],
) -> None:
    deep = b"\x0b" * (MAX_DEPTH + 5) + b"\x0c" * (MAX_DEPTH + 5)
    assert "nest deeper than 100 levels" in _refusal(messages["tei.v1.EmbedRequest"], deep)


def _raw_error(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    assert not PYTHON_NAMES.search(error.details() or ""), error.details()
    return error


def test_garbage_bytes_get_invalid_argument_saying_why(server: Server) -> None:
    embed = server.channel.unary_unary("/tei.v1.Embed/Embed")  # no serializers: bytes as they are
    error = _raw_error(embed, b"\xff\xff\xff")
    assert (
        error.details()
        == "the request is not a valid tei.v1.EmbedRequest message: at byte 0, the message ends inside a field's key (a varint)"
    )
    assert ("error-type", "malformed") in (error.trailing_metadata() or ())
    info = server.channel.unary_unary("/tei.v1.Info/Info")
    assert "not a valid tei.v1.InfoRequest message" in _raw_error(info, b"\x0a\x09ab").details()
    metrics = httpx.get(server.url + "/metrics").text
    assert 'route="/tei.v1.Info/Info",status="INVALID_ARGUMENT"' in metrics


def test_a_string_that_is_not_utf8_gets_invalid_argument_naming_the_field(server: Server) -> None:
    # A valid EmbedRequest but for its inputs' bytes: "a", then 0xff 0xfe.
    embed = server.channel.unary_unary("/tei.v1.Embed/Embed")
    assert _raw_error(embed, b"\x0a\x03a\xff\xfe\x10\x01").details() == (
        "the request is not a valid tei.v1.EmbedRequest message: field inputs (1) is not valid UTF-8: byte "
        "0xff at offset 1 of its 3 bytes (byte 3 of the message); send text as UTF-8"
    )
    ours = server.channel.unary_unary("/zhembed.v1.Zhembed/Embed")
    assert "field inputs[1] (1) is not valid UTF-8" in _raw_error(ours, b"\x0a\x01a\x0a\x01\xc3").details()


def test_a_stream_answers_until_the_message_that_does_not_parse(server: Server) -> None:
    stream = server.channel.stream_stream("/tei.v1.Embed/EmbedStream")
    answers: list[bytes] = []
    with pytest.raises(grpc.RpcError) as caught:
        for answer in stream(iter([b"\x0a\x03abc", b"\x0a\x01\xff"]), timeout=30):
            answers.append(answer)
    assert len(answers) == 1 and len(answers[0]) > 64 * 4  # the first one's vector
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "field inputs (1) is not valid UTF-8" in caught.value.details()
    rerank = server.channel.stream_unary("/tei.v1.Rerank/RerankStream")
    error = _raw_error(rerank, iter([b"\x0a\x01q\x12\x01a", b"\x12"]))
    assert error.details() == (
        "the request is not a valid tei.v1.RerankStreamRequest message: at byte 1, the message ends inside the length of field text (2) (a varint)"
    )
