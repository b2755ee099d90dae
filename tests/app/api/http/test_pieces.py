"""Large answers encoded a piece at a time: the bytes orjson writes for the whole."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from app.api.http.pieces import json_pieces

ROWS = np.arange(40 * 3, dtype=np.float32).reshape(40, 3) / 7
PAYLOADS: list[Any] = [
    [],
    {},
    [[]],
    [np.zeros((0, 3), dtype=np.float32)],
    ROWS,
    [ROWS, {"vectors": ROWS, "tokens": [{"id": 1, "text": "北"}] * 300, "norms": [1.5, 2.0]}],
    [[{"score": 0.5, "token": 7, "token_str": "京", "sequence": "北 京"}] * 50] * 3,
    {"entities": [1, 2], "word": "字"},
    list(range(1000)),
    "text",
    1.25,
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_pieces_are_the_whole_encoding(payload: Any) -> None:
    assert json_pieces(payload) == orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
