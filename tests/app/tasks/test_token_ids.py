"""Token-id inputs: their forms, and the checks against the limits and the vocabulary."""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.errors import EmptyInput, ValidationFailed
from app.tasks.options import listed
from app.tasks.token_ids import token_id_inputs, token_id_lists


def test_one_list_of_ids_is_one_input_and_texts_are_not_ids() -> None:
    one = token_id_lists([101, 7, 102])
    assert one is not None and one[0] == [[101, 7, 102]] and one[1].item(0) == "input"
    several = token_id_lists([[101, 102], [101, 8, 102]])
    assert (
        several is not None and several[0] == [[101, 102], [101, 8, 102]] and several[1].item(1) == "input[1]"
    )
    assert token_id_lists("你好") is None and token_id_lists(["你好"]) is None and token_id_lists([]) is None


def test_ids_are_keyed_by_their_digits_and_kept_as_given() -> None:
    sequences = [[101, 102], [101, 8, 102]]
    given = token_id_inputs(sequences, listed("input", sequences), 4, 8, 21128)
    assert list(given) == ["101,102", "101,8,102"]
    np.testing.assert_array_equal(given["101,8,102"], [101, 8, 102])  # no [CLS]/[SEP] added or removed


@pytest.mark.parametrize(
    ("sequences", "error", "words"),
    [
        ([], EmptyInput, "input is empty"),
        ([[101], []], EmptyInput, "input[1] is empty"),
        ([[1]] * 5, ValidationFailed, "5 inputs in one request; the limit is 4"),
        ([[1] * 9], ValidationFailed, "input[0] has 9 tokens, over the model's limit of 8"),
        ([[101, 21128]], ValidationFailed, "input[0][1] is 21128, not a token id of this model (0..21127)"),
        ([[-1]], ValidationFailed, "input[0][0] is -1"),
        ([[5, 2**64]], ValidationFailed, f"input[0][1] is {2**64}"),
    ],
)
def test_what_cannot_run_is_refused_by_name(
    sequences: list[list[int]], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        token_id_inputs(sequences, listed("input", sequences), 4, 8, 21128)
