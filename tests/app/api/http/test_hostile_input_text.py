"""Hostile input, odd text: control, zero-width, right-to-left and noncharacters, emoji, [MASK] and
other special tokens as text. Served where there is something to serve, refused with a clear message
where nothing is left of it (one table: each row a request and the answer it must get, ``hostile.py``)."""

from __future__ import annotations

import httpx
import pytest

from tests.app.api.http.hostile import Row, answers_as_the_row_says, masks, still_answers, vectors
from tests.app.conftest import Running

ROWS = [
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
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_odd_text_is_served_or_clearly_refused(client: httpx.Client, row: Row) -> None:
    answers_as_the_row_says(client, row)


def test_the_server_still_answers_after_the_table(client: httpx.Client, server: Running) -> None:
    still_answers(client, server)
