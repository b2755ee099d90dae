"""A validation error in the service's words, whatever value the client sent."""

from __future__ import annotations

import pydantic
import pytest

from app.api.field_errors import field_message
from app.api.schemas.embeddings import EmbedRequest


def _errors(body: dict[str, object]) -> list[dict[str, object]]:
    with pytest.raises(pydantic.ValidationError) as caught:
        EmbedRequest.model_validate(body)
    return [dict(e) for e in caught.value.errors()]


def test_an_integer_past_64_bits_is_repeated_in_the_message_not_a_fault() -> None:
    # The standard parser reads such a number (orjson refuses it); the message must still be written.
    huge = 5435675526948838653077026242560
    (error,) = _errors({"inputs": "a", "pooling": huge})
    message = field_message(error)
    assert message.startswith("pooling must be one of") and message.endswith(f"not {huge}")


def test_a_long_value_is_cut_in_the_message() -> None:
    (error,) = _errors({"inputs": "a", "pooling": "m" * 10_000})
    message = field_message(error)
    assert len(message) < 300 and message.endswith("…")
