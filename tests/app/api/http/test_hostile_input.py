"""Hostile input, one table: each row is a request and the status, error type and words of the message
it must get. No row may produce a 500, and the server must still answer afterwards.

Limits of the tiny test model: 128 tokens per sequence, 3 layers; of the settings: 64 inputs per
request, 8192 characters per input, 2 MiB per body.
"""

from __future__ import annotations

import json
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
    absent: tuple[str, ...] = ()  # none may appear in the error message


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
        ("inputs is not valid Unicode", "surrogates not allowed at character 0"),
        content=b'{"inputs": "\\ud800"}',
        # pydantic's union would add "Input should be a valid list" for the form not sent
        absent=("list", "Value error"),
    ),
    Row(
        "lone surrogate in a list",
        "/embed",
        422,
        "validation",
        ("inputs[1] is not valid Unicode",),
        content=b'{"inputs": ["a", "b\\udfff"]}',
    ),
    Row(
        "integer of 5000 digits",
        "/fill-mask",
        422,
        "validation",
        (),
        content=b'{"inputs": "[MASK]", "top_k": ' + b"9" * 5000 + b"}",
    ),
    Row(
        "deep nesting",
        "/embed",
        422,
        "validation",
        ("nests", "deeper than the JSON parser reads"),
        content=b'{"inputs": ' + b"[" * 5_000 + b"}",
        absent=("UTF-8",),
    ),
    # --- how many, how long ---
    Row(
        "10,000 inputs",
        "/embed",
        422,
        "validation",
        ("10000 inputs", "limit is 64", "ZHEMBED_MAX_INPUTS_PER_REQUEST", "several requests"),
        json={"inputs": ["a"] * 10_000},
    ),
    Row(
        "a 1 MB string",
        "/embed",
        422,
        "validation",
        ("inputs has 1048576 characters", "limit is 8192", "split the text", "ZHEMBED_MAX_INPUT_CHARS"),
        json={"inputs": "a" * (1 << 20)},
    ),
    Row(
        "a 100,002-character text with truncate",
        "/embed",
        422,
        "validation",
        ("inputs[0] has 100002 characters", "truncation does not lift it", "split the text"),
        json={"inputs": ["好" * 100_002], "truncate": True},
    ),
    Row("no inputs", "/embed", 400, "empty", ("inputs is empty",), json={"inputs": []}),
    Row("empty string", "/embed", 400, "empty", ("inputs is empty",), json={"inputs": ""}),
    Row(
        "empty string among others",
        "/embed",
        400,
        "empty",
        ("inputs[1] is empty",),
        json={"inputs": ["a", ""]},
    ),
    Row(
        "whitespace only",
        "/embed",
        400,
        "empty",
        ("inputs[1] is only whitespace",),
        json={"inputs": ["a", " \t\n"]},
    ),
    Row(
        "ideographic space only",
        "/embed",
        400,
        "empty",
        ("inputs is only whitespace",),
        json={"inputs": "\u3000"},
    ),
    Row(
        "similarity, no sentences",
        "/similarity",
        400,
        "empty",
        ("inputs.sentences is empty",),
        json={"inputs": {"source_sentence": "a", "sentences": []}},
    ),
    Row(
        "similarity, an empty sentence",
        "/similarity",
        400,
        "empty",
        ("inputs.sentences[1] is empty",),
        json={"inputs": {"source_sentence": "a", "sentences": ["b", ""]}},
    ),
    Row("similarity, no pairs", "/similarity", 400, "empty", ("pairs is empty",), json={"pairs": []}),
    Row(
        "similarity, whitespace in a pair",
        "/similarity",
        400,
        "empty",
        ("pairs[1][0] is only whitespace",),
        json={"pairs": [["a", "b"], [" ", "c"]]},
    ),
    # --- wrong types where text belongs ---
    Row(
        "null input",
        "/embed",
        422,
        "validation",
        ("inputs must be a string or a list of strings, not null",),
        json={"inputs": None},
    ),
    Row(
        "null in the list",
        "/embed",
        422,
        "validation",
        ("inputs[1] must be a string, not null",),
        json={"inputs": ["a", None]},
    ),
    Row(
        "a number",
        "/embed",
        422,
        "validation",
        ("inputs must be a string or a list of strings, not a number",),
        json={"inputs": 123},
        absent=("valid list", "valid string"),  # one sentence, not pydantic's two alternatives
    ),
    Row(
        "numbers in the list",
        "/embed",
        422,
        "validation",
        ("inputs[0] must be a string, not a number",),
        json={"inputs": [1, 2]},
    ),
    Row(
        "nested lists",
        "/embed",
        422,
        "validation",
        ("inputs[0] must be a string, not an array",),
        json={"inputs": [["a"]]},
    ),
    Row(
        "an object",
        "/embed",
        422,
        "validation",
        ("inputs must be a string or a list of strings, not an object",),
        json={"inputs": {"text": "a"}},
    ),
    Row(
        "token ids of another tokenizer",
        "/v1/embeddings",
        422,
        "validation",
        ("input[0][1] is 100257, not a token id of this model (0..21127)", "send the text"),
        json={"input": [[101, 100257, 102]]},
    ),
    Row(
        "a negative token id",
        "/v1/embeddings",
        422,
        "validation",
        ("input[2] is -1, not a token id",),
        json={"input": [101, 102, -1]},
    ),
    Row(
        "a token id past int64",
        "/v1/embeddings",
        422,
        "validation",
        ("input[0][0] is 1" + "0" * 30, "not a token id"),
        json={"input": [[10**30]]},
    ),
    Row(
        "strings and token ids mixed",
        "/v1/embeddings",
        422,
        "validation",
        ("input[1] must be a string, not an array",),
        json={"input": ["a", [101, 102]]},
    ),
    Row(
        "an empty list of token ids",
        "/v1/embeddings",
        400,
        "empty",
        ("input[1] is empty",),
        json={"input": [[101, 102], []]},
    ),
    Row(
        "too many token ids",
        "/v1/embeddings",
        422,
        "validation",
        ("input has 600 tokens, over the model's limit of 128", "POST /embed"),
        json={"input": [101] * 600},
    ),
    # --- odd but valid text ---
    Row("control characters", "/embed", 200, json={"inputs": ["a\x00\x01\x07b", "a\x00b"]}, check=vectors(2)),
    Row(
        "only control characters",
        "/embed",
        400,
        "empty",
        ("inputs[1] has no tokens",),
        json={"inputs": ["a", "\x00\x01\x07\x1b\x7f"]},
    ),
    Row("zero-width characters", "/embed", 200, json={"inputs": ["中\u200b文"]}, check=vectors(1)),
    Row(
        "only zero-width characters",
        "/embed",
        400,
        "empty",
        ("inputs has no tokens",),
        json={"inputs": "\u200b\u200c\u200d\ufeff"},
    ),
    Row(
        "only zero-width characters, token vectors",
        "/embed_all",
        400,
        "empty",
        ("inputs[0] has no tokens",),
        json={"inputs": ["\u200b"]},
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
        ("inputs has 602 tokens", "limit of 128", "long_text"),
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
        "layers as floats",
        "/embed",
        422,
        "validation",
        ("layers[0] must be an integer, not a number",),
        json={"inputs": "a", "layers": [1.5]},
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
    Row(
        "unknown pooling",
        "/embed",
        422,
        "validation",
        ("pooling",),
        json={"inputs": "a", "pooling": "median"},
    ),
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
    for word in row.absent:
        assert word not in message, message


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    if isinstance(body["error"], dict):  # OpenAI's shape
        return response.status_code, body["error"]["code"], body["error"]["message"]
    return response.status_code, body["error_type"], body["error"]


# The same mistake sent to each route that reads text: (path, body with the text in place of X).
TEXT_ROUTES = [
    ("/", lambda x: {"inputs": x}),
    ("/embed", lambda x: {"inputs": x}),
    ("/embed_all", lambda x: {"inputs": x}),
    ("/similarity", lambda x: {"inputs": {"source_sentence": "a", "sentences": x}}),
    ("/", lambda x: {"inputs": {"source_sentence": "a", "sentences": x}}),
    ("/fill-mask", lambda x: {"inputs": x}),
    ("/tokenize", lambda x: {"inputs": x}),
    ("/v1/embeddings", lambda x: {"input": x}),
]


@pytest.mark.parametrize(
    ("mistake", "value", "status", "error_type", "words"),
    [
        ("empty text", ["a", ""], 400, "empty", "[1] is empty"),
        ("whitespace only", ["a", "  "], 400, "empty", "[1] is only whitespace"),
        ("a number among texts", ["a", 7], 422, "validation", "[1] must be a string, not a number"),
        ("a lone surrogate", ["a", "\ud800"], 422, "validation", "[1] is not valid Unicode"),
        ("too many", ["a"] * 65, 422, "validation", "inputs in one request; the limit is 64"),
    ],
)
def test_the_same_mistake_gets_the_same_answer_on_every_route(
    client: httpx.Client, mistake: str, value: list[Any], status: int, error_type: str, words: str
) -> None:
    for path, body in TEXT_ROUTES:
        # json.dumps writes a lone surrogate as \ud800 (httpx's json= cannot encode it)
        sent = json.dumps(body(value)).encode()
        got_status, got_type, message = error_of(client.post(path, content=sent, headers=JSON))
        assert (got_status, got_type) == (status, error_type), (path, message)
        assert words in message, (path, message)


@pytest.mark.parametrize(
    ("method", "path", "allowed"), [("GET", "/embed", "POST"), ("POST", "/health", "GET")]
)
def test_a_wrong_method_gets_405_with_allow_and_a_hint(
    client: httpx.Client, method: str, path: str, allowed: str
) -> None:
    response = client.request(method, path)
    assert response.status_code == 405
    assert allowed in response.headers["allow"]
    assert response.json()["error_type"] == "method_not_allowed"
    assert f"{method} is not allowed on {path}: use {allowed}" in response.json()["error"]


def test_an_unknown_route_says_where_the_routes_are(client: httpx.Client) -> None:
    response = client.post("/embedd", json={"inputs": "a"})
    assert response.status_code == 404
    assert response.json()["error"] == "there is no route /embedd: the routes are listed at /docs"


def test_the_server_still_answers_after_the_table(client: httpx.Client, server: Running) -> None:
    assert client.post("/embed", json={"inputs": "还活着"}).status_code == 200
    assert server.service.engine.admission.in_use == 0
