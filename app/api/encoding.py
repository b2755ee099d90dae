"""Wire encodings of vectors: what the API layer applies to the arrays the service returns.

Per request, not per vector: :func:`encode_vectors` takes a whole answer ([inputs, width]) at once.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from app.tasks.options import Encoding, FloatEncoding
from app.tasks.sparse import SparseVector


def encode_vectors(
    vectors: np.ndarray | Sequence[np.ndarray], encoding: Encoding
) -> np.ndarray | list[str] | list[dict[str, object]]:
    """Every vector of ``vectors`` ([n, width], or n arrays of one width) in the requested encoding,
    ready for ``orjson`` with ``OPT_SERIALIZE_NUMPY``.

    - ``float``: the [n, width] float32 array; orjson writes it as a list of lists of numbers, each in
      the shortest form that reads back as the same float32 (``0.1``, not ``0.10000000149011612``:
      about 40% fewer bytes).
    - ``base64``: per vector, its little-endian float32 bytes base64-encoded.
    - ``int8``: per vector ``{"values": [int in -127..127], "scale": float}``; the vector is
      ``values × scale`` (symmetric per-vector quantisation, scale = max |x| / 127; 1.0 for a zero vector).
    - ``ubinary`` / ``binary``: per vector its signs packed one bit a component (:func:`binary_vectors`),
      ``ceil(width / 8)`` numbers: 0..255, or the same bytes less 128 as -128..127.
    """
    if not isinstance(vectors, np.ndarray):
        if not len(vectors):
            return []
        vectors = np.asarray(vectors)  # n arrays of one width: [n, width] (np.stack costs 3x as much)
    m = np.ascontiguousarray(vectors, dtype=np.float32)
    if m.ndim != 2:
        raise ValueError(f"encode_vectors takes [n, width] vectors, not an array of shape {m.shape}")
    if encoding == "float":
        return m
    if encoding == "base64":
        raw = memoryview(m.astype("<f4", copy=False).tobytes())
        step = m.shape[1] * 4
        return [
            binascii.b2a_base64(raw[i : i + step], newline=False).decode("ascii")
            for i in range(0, len(m) * step, step)
        ]
    if encoding in ("binary", "ubinary"):
        return binary_vectors(m, signed=encoding == "binary")
    values, scales = int8_vectors(m)
    return [{"values": row, "scale": scale} for row, scale in zip(values, scales.tolist(), strict=True)]


def int8_vectors(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``int8`` encoding of float32 ``vectors`` [n, width] as arrays: values int8 [n, width] and
    scales float64 [n], each vector ≈ values × scale (the bulk job writes these as Parquet columns)."""
    # float64 scales, as max |x| (a float32, exactly) / 127 in Python floats; the division in float32,
    # as a float32 vector divided by a Python float is.
    peaks = np.abs(vectors).max(axis=1, initial=0.0).astype(np.float64)
    scales = np.where(peaks > 0, peaks / 127, 1.0)
    values = np.clip(np.rint(vectors / scales.astype(np.float32)[:, None]), -127, 127).astype(np.int8)
    return values, scales


def binary_vectors(vectors: np.ndarray, signed: bool) -> np.ndarray:
    """float32 ``vectors`` [n, width] as one bit a component, 1 where it is above 0, packed big-end first
    into ``ceil(width / 8)`` bytes a vector (the last padded with 0 bits): uint8 [n, bytes], or with
    ``signed`` int8 (each byte less 128). The bytes of sentence-transformers' ``quantize_embeddings``
    with ``precision="ubinary"`` / ``"binary"``, which a Hamming-distance index (faiss, usearch) reads."""
    packed = np.packbits(vectors > 0, axis=-1)
    return (packed ^ np.uint8(0x80)).view(np.int8) if signed else packed


def encode_rows(rows: np.ndarray, encoding: FloatEncoding) -> np.ndarray | list[Any]:
    """Each row of [tokens, width] in the requested encoding (see :func:`encode_vectors`)."""
    return encode_vectors(rows, encoding)


_SPARSE_START, _SPARSE_VALUE, _SPARSE_NEXT, _SPARSE_END = b'[{"index":', b',"value":', b'},{"index":', b"}]"


def sparse_json(vectors: Sequence[SparseVector]) -> bytes:
    """TEI's /embed_sparse answer as JSON: per vector its entries as ``{"index": i, "value": v}``, in
    index order, each value in the shortest form that reads back as the same float32 (as
    :func:`encode_vectors`' ``float`` writes them).

    orjson writes each vector's indices and values as two arrays; their numbers are spliced into the
    entries' text, so that no dict or Python number is made per entry (on 256 entries two thirds of the time
    of a list of dicts through ``orjson.dumps``).
    """
    return b"[" + b",".join([_sparse_entries(v.indices, v.values) for v in vectors]) + b"]"


def _sparse_entries(indices: np.ndarray, values: np.ndarray) -> bytes:
    """One vector's ``[{"index": i, "value": v}, ...]``."""
    n = len(indices)
    if n == 0:
        return b"[]"
    parts = [_SPARSE_VALUE] * (4 * n)  # index, ',"value":', value, '},{"index":' for each entry
    parts[0::4] = _numbers(indices)
    parts[2::4] = _numbers(values)
    parts[3::4] = [_SPARSE_NEXT] * n
    parts[-1] = _SPARSE_END
    return _SPARSE_START + b"".join(parts)


def _numbers(array: np.ndarray) -> list[bytes]:
    """The JSON text of each number of a 1-d array, as orjson writes it."""
    return orjson.dumps(np.ascontiguousarray(array), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
