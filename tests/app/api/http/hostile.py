"""What the hostile-input tables share (``test_hostile_input*.py``): a row (a request, and the status,
error type and words of the message it must get), and the one check every row gets. No row may produce a
500, and the server must still answer afterwards.

Limits of the tiny test model: 128 tokens per sequence, 3 layers; of the settings: 64 inputs per
request, 8192 characters per input, 2 MiB per body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.app.conftest import Running

JSON = {"content-type": "application/json"}
LONG = "字" * 600  # 602 tokens with [CLS] and [SEP]: over 512, and over the tiny model's 128


@dataclass(frozen=True)
class Row:
    name: str
    path: str
    status: int
    error_type: str | None = None  # None for a 200
    words: tuple[str, ...] = ()  # each must appear in the error message
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    check: Callable[[Any], bool] | None = None  # on a 200's body
    absent: tuple[str, ...] = ()  # none may appear in the error message


def vectors(n: int) -> Callable[[Any], bool]:
    return lambda body: isinstance(body, list) and len(body) == n and all(len(v) > 0 for v in body)


def masks(n: int) -> Callable[[Any], bool]:
    """A string's fill-mask answer: for one [MASK] its 5 candidates, for several 5 per mask."""
    if n == 1:
        return lambda body: len(body) == 5 and all(isinstance(p, dict) for p in body)
    return lambda body: len(body) == n and all(len(p) == 5 and isinstance(p[0], dict) for p in body)


def answers_as_the_row_says(client: httpx.Client, row: Row) -> None:
    """Send the row's request; assert its status, and its error type and message words (or its check)."""
    response = client.post(row.path, json=row.json, content=row.content, headers=row.headers)
    assert response.status_code == row.status, response.text[:500]
    body = response.json()
    if row.error_type is None:
        if row.check is not None:
            assert row.check(body), str(body)[:500]
        return
    if row.path.startswith("/v1/"):
        message, error_type = body["error"]["message"], body["error"]["code"]
    else:
        message, error_type = body["error"], body["error_type"]
    assert error_type == row.error_type, body
    for word in row.words:
        assert word in message, message
    for word in row.absent:
        assert word not in message, message


def still_answers(client: httpx.Client, server: Running) -> None:
    """After a table: the server answers, and every admission permit was given back."""
    assert client.post("/embed", json={"inputs": "还活着"}).status_code == 200
    assert server.service.engine.admission.in_use == 0
