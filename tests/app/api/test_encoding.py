"""Wire encodings: float, base64 and int8, for vectors and token rows."""

from __future__ import annotations

import base64

import numpy as np
import orjson

from app.api.encoding import encode_rows, encode_vector


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
