"""Hostile input, one table: each row is a request and the status, error type and words of the message
it must get. No row may produce a 500, and the server must still answer afterwards.

Limits of the tiny test model: 128 tokens per sequence, 3 layers; of the settings: 64 inputs per
request, 8192 characters per input, 2 MiB per body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

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


def vectors(n: int) -> Callable[[Any], bool]:
    return lambda body: isinstance(body, list) and len(body) == n and all(len(v) > 0 for v in body)


def masks(n: int) -> Callable[[Any], bool]:
    """A string's fill-mask answer: for one [MASK] its 5 candidates, for several 5 per mask."""
    if n == 1:
        return lambda body: len(body) == 5 and all(isinstance(p, dict) for p in body)
    return lambda body: len(body) == n and all(len(p) == 5 and isinstance(p[0], dict) for p in body)


ROWS = [
    # --- the body itself ---
    Row("invalid JSON", "/embed", 422, "validation", ("not valid JSON",), content=b'{"inputs": "a",'),
    Row("empty body", "/embed", 422, "validation", ("no body",), content=b""),
    Row("JSON null body", "/embed", 422, "validation", ("a JSON object, not null",), content=b"null"),
    Row("JSON array body", "/embed", 422, "validation", ("a JSON object, not an array",), content=b'["a"]'),
    Row(
        "wrong content type",
        "/embed",
        422,
        "validation",
        ("Content-Type", "application/json"),
        content=b'{"inputs": "a"}',
        headers={"content-type": "text/plain"},
    ),
    Row(
        "no content type",
        "/embed",
        422,
        "validation",
        ("Content-Type", "application/json"),
        content=b'{"inputs": "a"}',
        headers={},
    ),
    Row(
        "body over the limit",
        "/embed",
        413,
        "payload_too_large",
        ("larger than the limit of 2097152 bytes",),
        content=b'{"inputs": "' + b"a" * (2 << 20) + b'"}',
    ),
    Row("invalid UTF-8 bytes", "/embed", 422, "validation", ("UTF-8",), content=b'{"inputs": "\xff\xfe"}'),
    Row(
        "lone surrogate",
        "/embed",
        422,
        "validation",
        ("not valid Unicode", "surrogates"),
        content=b'{"inputs": "\\ud800"}',
    ),
    Row(
        "integer of 5000 digits",
        "/fill-mask",
        422,
        "validation",
        (),
        content=b'{"inputs": "[MASK]", "top_k": ' + b"9" * 5000 + b"}",
    ),
    Row("deep nesting", "/embed", 422, "validation", (), content=b'{"inputs": ' + b"[" * 100_000 + b"}"),
    # --- how many, how long ---
    Row(
        "10,000 inputs",
        "/embed",
        422,
        "validation",
        ("10000 inputs", "limit is 64"),
        json={"inputs": ["a"] * 10_000},
    ),
    Row(
        "a 1 MB string",
        "/embed",
        422,
        "validation",
        ("inputs[0] has 1048576 characters", "limit is 8192"),
        json={"inputs": "a" * (1 << 20)},
    ),
    Row("no inputs", "/embed", 400, "empty", ("inputs is empty",), json={"inputs": []}),
    Row("empty string", "/embed", 400, "empty", ("inputs[0] is empty",), json={"inputs": ""}),
    Row(
        "empty string among others",
        "/embed",
        400,
        "empty",
        ("inputs[1] is empty",),
        json={"inputs": ["a", ""]},
    ),
    Row("whitespace only", "/embed", 200, json={"inputs": ["   ", "\t\n"]}, check=vectors(2)),
    # --- wrong types where text belongs ---
    Row("null input", "/embed", 422, "validation", ("inputs",), json={"inputs": None}),
    Row("null in the list", "/embed", 422, "validation", ("inputs.1",), json={"inputs": ["a", None]}),
    Row("a number", "/embed", 422, "validation", ("inputs",), json={"inputs": 42}),
    Row("numbers in the list", "/embed", 422, "validation", ("inputs.0",), json={"inputs": [1, 2]}),
    Row("nested lists", "/embed", 422, "validation", ("inputs.0",), json={"inputs": [["a"]]}),
    Row("an object", "/embed", 422, "validation", ("inputs",), json={"inputs": {"text": "a"}}),
    Row(
        "token ids (OpenAI style)",
        "/v1/embeddings",
        422,
        "validation",
        ("input",),
        json={"input": [[101, 102]]},
    ),
    # --- odd but valid text ---
    Row(
        "control characters",
        "/embed",
        200,
        json={"inputs": ["\x00\x01\x07\x1b\x7f", "a\x00b"]},
        check=vectors(2),
    ),
    Row(
        "zero-width characters",
        "/embed",
        200,
        json={"inputs": ["\u200b\u200c\u200d\ufeff", "中\u200b文"]},
        check=vectors(2),
    ),
    Row(
        "right-to-left text",
        "/embed",
        200,
        json={"inputs": ["مرحبا بالعالم", "שלום עולם", "\u202eabc\u202c"]},
        check=vectors(3),
    ),
    Row("emoji", "/embed", 200, json={"inputs": ["🙂👍🏽👨‍👩‍👧", "🇨🇳" * 20]}, check=vectors(2)),
    Row("noncharacters", "/embed", 200, json={"inputs": ["\uffff\U0010ffff\ufdd0"]}, check=vectors(1)),
    Row(
        "only [MASK] tokens, embedded", "/embed", 200, json={"inputs": "[MASK][MASK][MASK]"}, check=vectors(1)
    ),
    Row("only a [MASK] token, filled", "/fill-mask", 200, json={"inputs": "[MASK]"}, check=masks(1)),
    Row("100 masks", "/fill-mask", 200, json={"inputs": "[MASK]" * 100}, check=masks(100)),
    Row(
        "129 masks in one request",
        "/fill-mask",
        422,
        "validation",
        ("129 [MASK] tokens", "limit is 128"),
        json={"inputs": ["[MASK]" * 100, "[MASK]" * 29]},
    ),
    Row("special tokens as text", "/tokenize", 200, json={"inputs": "[CLS][SEP][PAD][UNK]"}),
    # --- long text, each mode ---
    Row(
        "over 512 tokens, long_text error",
        "/embed",
        422,
        "validation",
        ("602 tokens", "limit of 128", "long_text"),
        json={"inputs": LONG, "long_text": "error"},
    ),
    Row(
        "over 512 tokens, long_text truncate",
        "/embed",
        200,
        json={"inputs": LONG, "long_text": "truncate"},
        check=vectors(1),
    ),
    Row(
        "over 512 tokens, long_text chunk",
        "/embed",
        200,
        json={"inputs": LONG, "long_text": "chunk"},
        check=vectors(1),
    ),
    Row(
        "over 512 tokens, TEI truncate",
        "/embed",
        200,
        json={"inputs": LONG, "truncate": True},
        check=vectors(1),
    ),
    Row(
        "over 512 tokens, fill-mask",
        "/fill-mask",
        422,
        "validation",
        ("603 tokens", "limit of 128", "fill-mask cannot truncate"),
        json={"inputs": LONG + "[MASK]"},
    ),
    Row(
        "long_text unknown",
        "/embed",
        422,
        "validation",
        ("long_text",),
        json={"inputs": "a", "long_text": "summarise"},
    ),
    # --- numbers out of range ---
    Row(
        "layer 0",
        "/embed",
        422,
        "validation",
        ("layer 0 is out of range",),
        json={"inputs": "a", "layers": [0]},
    ),
    Row(
        "layer 13",
        "/embed",
        422,
        "validation",
        ("layer 13 is out of range",),
        json={"inputs": "a", "layers": [13]},
    ),
    Row(
        "layer -13",
        "/embed",
        422,
        "validation",
        ("layer -13 is out of range",),
        json={"inputs": "a", "layers": [-13]},
    ),
    Row(
        "layers as floats", "/embed", 422, "validation", ("layers.0",), json={"inputs": "a", "layers": [1.5]}
    ),
    Row("65 layers", "/embed", 422, "validation", ("layers",), json={"inputs": "a", "layers": [1] * 65}),
    Row("top_k 0", "/fill-mask", 422, "validation", ("top_k",), json={"inputs": "[MASK]", "top_k": 0}),
    Row("top_k 10^9", "/fill-mask", 422, "validation", ("top_k",), json={"inputs": "[MASK]", "top_k": 10**9}),
    Row(
        "top_k as a string",
        "/fill-mask",
        422,
        "validation",
        ("top_k",),
        json={"inputs": "[MASK]", "top_k": "5"},
    ),
    Row(
        "huge layer number",
        "/embed",
        422,
        "validation",
        ("out of range",),
        json={"inputs": "a", "layers": [10**30]},
    ),
    Row(
        "huge top_k", "/fill-mask", 422, "validation", ("top_k",), json={"inputs": "[MASK]", "top_k": 10**30}
    ),
    Row(
        "top_k 1e400 (infinity)",
        "/fill-mask",
        422,
        "validation",
        ("top_k",),
        content=b'{"inputs": "[MASK]", "top_k": 1e400}',
    ),
    Row(
        "top_k NaN",
        "/fill-mask",
        422,
        "validation",
        ("top_k",),
        content=b'{"inputs": "[MASK]", "top_k": NaN}',
    ),
    Row(
        "huge dimensions",
        "/v1/embeddings",
        422,
        "validation",
        ("dimensions",),
        json={"input": "a", "dimensions": 10**30},
    ),
    # --- unknown and conflicting fields ---
    Row(
        "unknown fields are ignored",
        "/embed",
        200,
        json={"inputs": "a", "colour": "blue", "x": [1]},
        check=vectors(1),
    ),
    Row("unknown pooling", "/embed", 422, "validation", ("pooling",), json={"inputs": "a", "pooling": "max"}),
    Row(
        "similarity with both forms",
        "/similarity",
        422,
        "validation",
        ("exactly one",),
        json={"inputs": {"source_sentence": "a", "sentences": ["b"]}, "pairs": [["a", "b"]]},
    ),
    Row(
        "similarity pair of three",
        "/similarity",
        422,
        "validation",
        ("pairs",),
        json={"pairs": [["a", "b", "c"]]},
    ),
    Row(
        "similarity, 65 sentences",
        "/similarity",
        422,
        "validation",
        ("66 inputs",),
        json={"inputs": {"source_sentence": "a", "sentences": ["b"] * 65}},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_hostile_input(client: httpx.Client, row: Row) -> None:
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


def test_the_server_still_answers_after_the_table(client: httpx.Client, server: Running) -> None:
    assert client.post("/embed", json={"inputs": "还活着"}).status_code == 200
    assert server.service.engine.admission.in_use == 0
