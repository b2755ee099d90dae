"""Hostile input, the limits: how many inputs and how long, text over the model's length in each
``long_text`` mode, numbers out of range (one table: each row a request and the answer it must get,
``hostile.py``, which lists the tiny model's and the settings' limits)."""

from __future__ import annotations

import httpx
import pytest

from tests.app.api.http.hostile import LONG, Row, answers_as_the_row_says, still_answers, vectors
from tests.app.conftest import Running

ROWS = [
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
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_a_request_over_a_limit_gets_a_clear_answer(client: httpx.Client, row: Row) -> None:
    answers_as_the_row_says(client, row)


def test_the_server_still_answers_after_the_table(client: httpx.Client, server: Running) -> None:
    still_answers(client, server)
