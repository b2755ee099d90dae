"""Wire encodings of vectors: what the API layer applies to the arrays the service returns.

Per request, not per vector: :func:`encode_vectors` takes a whole answer ([inputs, width]) at once.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.tasks.options import Encoding, FloatEncoding


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
