"""Cohere's input types as a model's sentence-transformers prompts (:func:`app.tasks.retrieval.input_prompt`)."""

from __future__ import annotations

import pytest

from app.errors import ValidationFailed
from app.tasks.retrieval import input_prompt

BGE = {"query": "为这个句子生成表示以用于检索相关文章："}  # bge-zh's one prompt
E5 = {"query": "query: ", "passage": "passage: "}
NAMED = {"search_query": "q: ", "query": "other: ", "classification": "c: ", "clustering": "k: "}


@pytest.mark.parametrize(
    ("input_type", "prompts", "want"),
    [
        ("search_query", BGE, "query"),
        ("search_document", BGE, None),  # bge-zh's documents take no prompt
        ("classification", BGE, None),
        ("search_query", E5, "query"),
        ("search_document", E5, "passage"),
        ("search_query", NAMED, "search_query"),  # Cohere's own name first
        ("classification", NAMED, "classification"),
        ("clustering", NAMED, "clustering"),
        ("search_query", {}, None),
    ],
)
def test_input_type_takes_the_first_prompt_of_its_names_the_model_has(
    input_type: str, prompts: dict[str, str], want: str | None
) -> None:
    assert input_prompt(input_type, prompts, default="query") == want


def test_no_input_type_takes_the_models_default_prompt() -> None:
    assert input_prompt(None, E5, default="passage") == "passage"


@pytest.mark.parametrize("input_type", ["image", "search"])
def test_image_and_unknown_input_types_are_refused(input_type: str) -> None:
    with pytest.raises(ValidationFailed, match="input_type"):
        input_prompt(input_type, E5, default=None)
