"""Hostile input, the form of a request: the body itself, wrong types where text belongs, unknown and
conflicting fields (one table: each row a request and the answer it must get, ``hostile.py``); the same
mistake sent to every route that reads text; a wrong method or route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.app.api.http.hostile import JSON, Row, answers_as_the_row_says, still_answers, vectors
from tests.app.conftest import Running

ROWS = [
    # --- the body itself ---
    Row("invalid JSON", "/embed", 400, "malformed", ("not valid JSON",), content=b'{"inputs": "a",'),
    Row("empty body", "/embed", 422, "validation", ("no body",), content=b""),
    Row("JSON null body", "/embed", 422, "validation", ("a JSON object, not null",), content=b"null"),
    Row("JSON array body", "/embed", 422, "validation", ("a JSON object, not an array",), content=b'["a"]'),
    Row(
        "wrong content type",
        "/embed",
        400,
        "malformed",
        ("Content-Type", "application/json"),
        content=b'{"inputs": "a"}',
        headers={"content-type": "text/plain"},
    ),
    Row(
        "no content type",
        "/embed",
        400,
        "malformed",
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
    Row("invalid UTF-8 bytes", "/embed", 400, "malformed", ("UTF-8",), content=b'{"inputs": "\xff\xfe"}'),
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
        400,
        "malformed",
        (),
        content=b'{"inputs": "[MASK]", "top_k": ' + b"9" * 5000 + b"}",
    ),
    Row(
        "deep nesting",
        "/embed",
        400,
        "malformed",
        ("nests", "deeper than the JSON parser reads"),
        content=b'{"inputs": ' + b"[" * 5_000 + b"}",
        absent=("UTF-8",),
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
def test_a_malformed_request_gets_a_clear_answer(client: httpx.Client, row: Row) -> None:
    answers_as_the_row_says(client, row)


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
    still_answers(client, server)
