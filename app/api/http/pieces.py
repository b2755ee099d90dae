"""Large answers as JSON in pieces, for encoding on a thread beside the event loop.

orjson holds the interpreter lock for the whole of one call: a thread that encoded /embed_all's
largest answer (4,096 token vectors of 768 floats, 33 MB) in one call would hold the event loop for
the 0.2–0.4 s it takes. Encoded a list element, a dict value or an array row at a time, each call is
short, and the loop takes the lock back between calls (within the interpreter's switch interval, 5 ms).
The bytes are orjson's for the whole payload (compact, the same numbers).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# Items of a list of plain values (or rows of an array) encoded per call: a few hundred microseconds.
_SLICE = 256
_ROWS = 16


def json_pieces(payload: Any) -> bytes:
    """``orjson.dumps(payload, option=OPT_SERIALIZE_NUMPY)``, encoded a piece at a time: a list holding
    containers an item at a time, another list a slice of items at a time, an array of rows a few rows
    at a time, a dict holding a list or an array a value at a time; anything else in one call. The
    pieces are joined once, at the end (each join of a level would copy the whole answer again)."""
    out: list[bytes] = []
    _write(payload, out)
    return b"".join(out)


def _write(payload: Any, out: list[bytes]) -> None:
    """Append ``payload``'s JSON to ``out``, a piece at a time (:func:`json_pieces`)."""
    if isinstance(payload, list) and any(_container(item) for item in payload):
        out.append(b"[")
        for i, item in enumerate(payload):
            if i:
                out.append(b",")
            _write(item, out)
        out.append(b"]")
    elif isinstance(payload, list) or (isinstance(payload, np.ndarray) and payload.ndim > 1):
        size = _SLICE if isinstance(payload, list) else _ROWS
        out.append(b"[")
        for start in range(0, len(payload), size):
            if start:
                out.append(b",")
            out.append(orjson.dumps(payload[start : start + size], option=_OPTIONS)[1:-1])
        out.append(b"]")
    elif _container(payload):
        out.append(b"{")
        for i, (key, value) in enumerate(payload.items()):
            out.append(b"," + orjson.dumps(key) + b":" if i else orjson.dumps(key) + b":")
            _write(value, out)
        out.append(b"}")
    else:
        out.append(orjson.dumps(payload, option=_OPTIONS))


def _container(value: Any) -> bool:
    """Whether :func:`json_pieces` takes ``value`` apart."""
    if isinstance(value, list):
        return True
    if isinstance(value, np.ndarray):
        return value.ndim > 1
    return isinstance(value, dict) and any(isinstance(v, list | np.ndarray) for v in value.values())
