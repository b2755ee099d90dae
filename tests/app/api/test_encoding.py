"""Wire encodings: float, base64, int8 and the bit-packed ubinary / binary, for a request's vectors, one
vector, and token rows."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
import orjson
import pytest

from app.api.encoding import binary_vectors, encode_rows, encode_vectors, sparse_json
from app.tasks.options import Encoding
from app.tasks.sparse import SparseVector


def encode_vector(vector: np.ndarray, encoding: Encoding) -> np.ndarray | str | dict[str, object]:
    """One vector in ``encoding``, as a request's one row."""
    return encode_vectors(vector[None, :], encoding)[0]


def test_encodings_round_trip() -> None:
    v = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    as_float = encode_vector(v, "float")
    assert isinstance(as_float, np.ndarray) and as_float.dtype == np.float32
    np.testing.assert_array_equal(as_float, v)
    raw = encode_vector(v, "base64")
    assert isinstance(raw, str)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(raw), "<f4"), v)
    q = encode_vector(v, "int8")
    assert isinstance(q, dict)
    values, scale = np.asarray(q["values"]), float(q["scale"])  # type: ignore[arg-type]
    assert values[2] == 127
    np.testing.assert_allclose(values * scale, v, atol=scale / 2)
    zero = encode_vector(np.zeros(3, np.float32), "int8")
    assert isinstance(zero, dict) and zero["scale"] == 1.0
    np.testing.assert_array_equal(zero["values"], [0, 0, 0])


def test_float32_json_is_shortest_and_exact() -> None:
    """What the routes write: each float32 in its shortest decimal form, read back bit for bit."""
    v = np.array([0.1, -1.0 / 3.0, 1e-8, 123456.78], dtype=np.float32)
    payload = [encode_vector(v, "float"), encode_vector(v, "int8")]
    text = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    assert text.startswith(b"[[0.1,")  # float32(0.1) printed as a double would be 0.10000000149011612
    back = orjson.loads(text)
    np.testing.assert_array_equal(np.array(back[0], dtype=np.float32), v)
    assert back[1]["values"][0] == round(0.1 / (123456.78 / 127))


def test_rows_encode() -> None:
    rows = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(encode_rows(rows, "float"), rows)
    encoded = encode_rows(rows, "base64")
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded[0]), "<f4"), rows[0])
    assert orjson.dumps(encode_rows(rows, "float"), option=orjson.OPT_SERIALIZE_NUMPY) == (
        b"[[3.0,4.0],[0.0,0.0]]"
    )
    assert len(encode_rows(np.zeros((0, 2), np.float32), "float")) == 0


def encode_one(vector: np.ndarray, encoding: Encoding) -> np.ndarray | str | dict[str, object]:
    """The per-vector encoding the routes used before encode_vectors: the reference it must match."""
    v = np.ascontiguousarray(vector, dtype=np.float32)
    if encoding == "float":
        return v
    if encoding == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    peak = float(np.abs(v).max()) if v.size else 0.0
    scale = peak / 127 if peak > 0 else 1.0
    values = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
    return {"values": values, "scale": scale}


def random_vectors(n: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(n * 1000 + width)
    vectors = (rng.standard_normal((n, width)) * rng.uniform(1e-3, 1e3, (n, 1))).astype(np.float32)
    vectors[n // 2] = 0.0  # a zero vector among them
    return vectors


@pytest.mark.parametrize("encoding", ["float", "base64", "int8"])
@pytest.mark.parametrize(("n", "width"), [(1, 768), (3, 5), (32, 768), (7, 1)])
def test_a_whole_request_encodes_as_each_vector_did(encoding: Encoding, n: int, width: int) -> None:
    vectors = random_vectors(n, width)
    want = orjson.dumps([encode_one(v, encoding) for v in vectors], option=orjson.OPT_SERIALIZE_NUMPY)
    for given in (vectors, list(vectors)):  # the service's 2-D array, or one array per input
        got = orjson.dumps(encode_vectors(given, encoding), option=orjson.OPT_SERIALIZE_NUMPY)
        assert got == want


def test_int8_scales_and_values_equal_the_per_vector_ones() -> None:
    vectors = random_vectors(64, 768)
    for got, v in zip(encode_vectors(vectors, "int8"), vectors, strict=True):
        want = encode_one(v, "int8")
        assert isinstance(got, dict) and isinstance(want, dict)
        assert type(got["scale"]) is float and got["scale"] == want["scale"]
        np.testing.assert_array_equal(got["values"], want["values"])
    zero = encode_vectors(vectors, "int8")[32]
    assert isinstance(zero, dict) and zero["scale"] == 1.0  # the zero vector


def test_no_vectors_encode_to_an_empty_list() -> None:
    assert orjson.dumps(encode_vectors([], "float"), option=orjson.OPT_SERIALIZE_NUMPY) == b"[]"
    empty = np.zeros((0, 4), np.float32)
    encodings: tuple[Encoding, ...] = ("float", "base64", "int8", "binary", "ubinary")
    for encoding in encodings:
        assert orjson.dumps(encode_vectors(empty, encoding), option=orjson.OPT_SERIALIZE_NUMPY) == b"[]"


@pytest.mark.parametrize("width", [768, 384, 13, 1])
def test_binary_and_ubinary_are_the_bytes_of_quantize_embeddings(width: int) -> None:
    from sentence_transformers import quantize_embeddings

    vectors = random_vectors(9, width)
    vectors[1, : width // 2] = 0.0  # exact zeros are 0 bits, as "> 0" makes them
    pairs: tuple[tuple[Literal["binary", "ubinary"], type[np.generic]], ...] = (
        ("binary", np.int8),
        ("ubinary", np.uint8),
    )
    for precision, dtype in pairs:
        want = quantize_embeddings(vectors, precision=precision)
        got = binary_vectors(vectors, signed=precision == "binary")
        assert got.dtype == want.dtype == dtype and got.shape == (9, -(-width // 8))
        assert got.tobytes() == want.tobytes()
        wire = orjson.dumps(encode_vectors(vectors, precision), option=orjson.OPT_SERIALIZE_NUMPY)
        assert orjson.loads(wire) == want.tolist()


def test_ubinary_bits_are_the_signs_big_end_first() -> None:
    v = np.array([[1.0, -1.0, 0.5, 0.0, -2.0, 3.0, 1e-30, -1e-30, 7.0]], np.float32)
    (ubinary,) = binary_vectors(v, signed=False).tolist()
    assert ubinary == [0b10100110, 0b10000000]  # the ninth bit starts a second byte, padded with 0s
    (binary,) = binary_vectors(v, signed=True).tolist()
    assert binary == [0b10100110 - 128, 0b10000000 - 128]


def test_sparse_json_is_tei_entries_each_value_the_same_float32() -> None:
    """/embed_sparse's body: per vector ``[{"index", "value"}, ...]`` in index order, an empty vector as
    ``[]``, each weight in its shortest form that reads back bit for bit."""
    rng = np.random.default_rng(0)
    values = np.concatenate([[0.1, 1e-8, 123456.78, 3.0], rng.random(300)]).astype(np.float32)
    indices = np.sort(rng.choice(21128, len(values), replace=False)).astype(np.int32)
    vectors = [
        SparseVector(indices, values),
        SparseVector(np.empty(0, np.int32), np.empty(0, np.float32)),
        SparseVector(np.array([7], np.int32), np.array([2.5], np.float32)),
    ]
    text = sparse_json(vectors)
    back = orjson.loads(text)
    assert back[1] == [] and back[2] == [{"index": 7, "value": 2.5}]
    assert [list(e) for e in back[0]] == [["index", "value"]] * len(values)
    assert [e["index"] for e in back[0]] == indices.tolist()
    np.testing.assert_array_equal(np.array([e["value"] for e in back[0]], np.float32), values)
    assert text.startswith(b'[[{"index":%d,"value":0.1},' % indices[0])


def test_sparse_json_equals_a_list_of_dicts_through_orjson() -> None:
    """The same JSON as orjson writes for the entries as dicts with float32 weights."""
    rng = np.random.default_rng(1)
    vectors = [
        SparseVector(np.sort(rng.choice(50, n, replace=False)).astype(np.int32), rng.random(n, np.float32))
        for n in (1, 2, 17, 50)
    ]
    dicts = [
        [{"index": int(i), "value": v} for i, v in zip(x.indices, x.values, strict=True)] for x in vectors
    ]
    assert sparse_json(vectors) == orjson.dumps(dicts, option=orjson.OPT_SERIALIZE_NUMPY)
    assert sparse_json([]) == b"[]"
