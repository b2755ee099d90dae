"""The preparation stage: a request's inputs become the sequences to run, and every bad input its own
problem, named as the request named it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.errors import EmptyInput, ValidationFailed
from app.tasks.options import Names, listed
from app.tasks.prepare import (
    GivenIds,
    Rules,
    check_some,
    given_ids,
    prepare,
    text_problems,
    texts_of,
    too_long,
)
from app.tasks.windows import truncate_pair

CLS, SEP = 101, 102
NAME = listed("inputs", ["a", "b"]).item  # inputs[i]


def _ids(body: int, start: int = 1000) -> np.ndarray:
    return np.array([CLS, *range(start, start + body), SEP], dtype=np.int64)


def _rules(limit: int = 8, long_text: str = "error", **more: object) -> Rules:
    return Rules(limit, "shorten it", long_text, specials=(CLS, SEP), **more)  # type: ignore[arg-type]


def test_the_common_case_runs_the_inputs_as_they_are() -> None:
    ids = [_ids(3), _ids(6)]
    prepared = prepare(ids, _rules(), NAME)
    assert prepared.ids is ids and prepared.windows is None and not prepared.problems
    assert prepared.inputs.tolist() == [0, 1] and prepared.tokens.tolist() == [5, 8]
    prepared.refuse()  # nothing to refuse


def test_every_bad_input_gets_its_own_problem_and_the_rest_still_run() -> None:
    ids = [_ids(3), _ids(0), _ids(9), _ids(2), _ids(0, 0)]  # fine, no tokens, too long, fine, no tokens
    prepared = prepare(ids, _rules(), NAME)
    assert sorted(prepared.problems) == [1, 2, 4]
    assert isinstance(prepared.problems[1], EmptyInput) and isinstance(prepared.problems[2], ValidationFailed)
    assert prepared.problems[1].message == (
        "inputs[1] has no tokens: its characters are all ones the tokenizer drops"
    )
    assert prepared.problems[2].message == "inputs[2] has 11 tokens, over the model's limit of 8; shorten it"
    assert prepared.problems[4].message.startswith("inputs[4] has no tokens")
    assert prepared.inputs.tolist() == [0, 3] and [x.tolist() for x in prepared.ids] == [
        ids[0].tolist(),
        ids[3].tolist(),
    ]
    assert prepared.lengths.tolist() == [5, 2, 11, 4, 2] and prepared.tokens.tolist() == [5, 4]
    with pytest.raises(EmptyInput, match=re.escape("inputs[1] has no tokens")):
        prepared.refuse()  # a request is refused at its first bad input


def test_the_length_refusal_names_the_input_and_the_remedy() -> None:
    assert not prepare([_ids(510)], Rules(512, "shorten it"), NAME).problems  # 512: the limit itself
    assert too_long("inputs[3]", 513, 512, "shorten it").message == (
        "inputs[3] has 513 tokens, over the model's limit of 512; shorten it"
    )


def test_a_route_that_runs_inputs_without_tokens_does_not_refuse_them() -> None:
    prepared = prepare([_ids(0), np.array([5])], _rules(refuse_empty=False), NAME)
    assert not prepared.problems and len(prepared.ids) == 2


@pytest.mark.parametrize(("direction", "body"), [("right", [1000, 1001, 1002]), ("left", [1006, 1007, 1008])])
def test_truncation_keeps_one_end_and_says_which_positions_ran(direction: str, body: list[int]) -> None:
    ids = [_ids(2), _ids(9)]  # 4 and 11 tokens, limit 5
    prepared = prepare(ids, _rules(5, "truncate", direction=direction), NAME)
    assert not prepared.problems
    assert [x.tolist() for x in prepared.ids] == [ids[0].tolist(), [CLS, *body, SEP]]
    np.testing.assert_array_equal(prepared.positions(0), [0, 1, 2, 3])
    np.testing.assert_array_equal(prepared.positions(1), [0, *(b - 999 for b in body), 10])
    assert prepared.tokens.tolist() == [4, 11]  # counted before the cut
    assert prepared.windows is not None and prepared.windows[0].tolist() == [0, 1]


@pytest.mark.parametrize(("direction", "body"), [("right", [1003, 1004]), ("left", [1009, 1010])])
def test_truncation_keeps_the_prompt_whichever_end_it_cuts(direction: str, body: list[int]) -> None:
    ids = _ids(11)  # [CLS] 1000 … 1010 [SEP]: 1000..1002 the prompt, the text after it
    prepared = prepare([ids], _rules(7, "truncate", direction=direction, keep=4), NAME)
    assert [x.tolist() for x in prepared.ids] == [[CLS, 1000, 1001, 1002, *body, SEP]]


def test_chunks_are_windows_that_say_which_input_they_belong_to() -> None:
    ids = [_ids(10), _ids(1, 500)]  # 12 tokens, limit 6: 4 body tokens per window
    prepared = prepare(ids, _rules(6, "chunk"), NAME)
    assert [len(x) for x in prepared.ids] == [6, 6, 4, 3]
    assert all(x[0] == CLS and x[-1] == SEP for x in prepared.ids)
    np.testing.assert_array_equal(np.concatenate([x[1:-1] for x in prepared.ids[:3]]), ids[0][1:-1])
    assert prepared.windows is not None
    owners, tokens = prepared.windows
    assert owners.tolist() == [0, 0, 0, 1] and tokens.tolist() == [4, 4, 2, 1]


def test_pairs_are_cut_as_pairs_and_texts_beside_them_as_texts() -> None:
    pair = np.array([CLS, *range(1000, 1006), SEP, *range(2000, 2004), SEP], dtype=np.int64)
    types = np.array([0] * 8 + [1] * 5, dtype=np.int64)
    prepared = prepare([_ids(9), pair], _rules(8, "truncate"), NAME, [None, types])
    want_ids, want_types = truncate_pair(pair, types, 8, "right")
    assert [x.tolist() for x in prepared.ids] == [[CLS, *range(1000, 1006), SEP], want_ids.tolist()]
    assert prepared.types is not None and prepared.types[0] is None
    assert prepared.types[1] is not None and prepared.types[1].tolist() == want_types.tolist()


def test_texts_that_cannot_be_tokenised_are_each_reported() -> None:
    problems = text_problems(["好", "", "一" * 6, " \n", "好"], 5, NAME)
    assert {i: p.message for i, p in problems.items()} == {
        1: "inputs[1] is empty",
        2: problems[2].message,
        3: "inputs[3] is only whitespace: it has no tokens",
    }
    assert problems[2].message.startswith("inputs[2] has 6 characters; the limit is 5 per input")


def test_given_ids_are_kept_as_given_and_keyed_by_their_digits() -> None:
    sequences = [[101, 102], [101, 8, 102]]
    given, problems = given_ids(sequences, _rules(), listed("input", sequences), 4, 21128)
    assert not problems and given.keys == ["101,102", "101,8,102"]
    np.testing.assert_array_equal(given.ids[1], [101, 8, 102])  # no [CLS]/[SEP] added or removed


def test_every_bad_list_of_ids_is_reported_by_name() -> None:
    sequences = [[5], [], [1] * 9, [101, 21128], [7, 102]]
    given, problems = given_ids(sequences, _rules(), listed("input", sequences), 8, 21128)
    assert [g.tolist() for g in given.ids] == [[5], [7, 102]]
    assert {i: p.message.split(";")[0] for i, p in problems.items()} == {
        1: "input[1] is empty",
        2: "input[2] has 9 tokens, over the model's limit of 8",
        3: "input[3][1] is 21128, not a token id of this model (0..21127)",
    }


def _first_problem(sequences: list[list[int]]) -> GivenIds:
    """The ids as a request checks them: its first bad list refuses it."""
    given, problems = given_ids(sequences, _rules(), listed("input", sequences), 4, 21128)
    if problems:
        raise problems[min(problems)]
    return given


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
        _first_problem(sequences)


def test_texts_are_checked_against_the_limits() -> None:
    assert texts_of("一", 2, 5) == ["一"]
    assert texts_of(["一", "二"], 2, 5) == ["一", "二"]
    with pytest.raises(EmptyInput, match="inputs is empty"):
        texts_of([], 2, 5)
    with pytest.raises(EmptyInput, match=re.escape("inputs[1] is empty")):
        texts_of(["一", ""], 2, 5)
    with pytest.raises(ValidationFailed, match="3 inputs in one request; the limit is 2"):
        texts_of(["一"] * 3, 2, 5)
    with pytest.raises(ValidationFailed, match=re.escape("inputs[0] has 6 characters; the limit is 5")):
        texts_of(["一" * 6], 2, 5)


@pytest.mark.parametrize("blank", [" ", "\t\n", "\u3000", "\u00a0 "])
def test_whitespace_only_is_empty_like_the_empty_string(blank: str) -> None:
    with pytest.raises(EmptyInput, match=re.escape("inputs[1] is only whitespace")):
        texts_of(["一", blank], 2, 5)
    assert texts_of([" 一 "], 2, 5) == [" 一 "]  # spaces around text are text's business


def test_messages_name_texts_as_the_request_wrote_them() -> None:
    with pytest.raises(EmptyInput, match=r"^inputs is empty$"):
        texts_of("", 2, 5)  # one string: no index
    pairs = Names("pairs", lambda k: f"pairs[{k // 2}][{k % 2}]")
    with pytest.raises(EmptyInput, match=re.escape("pairs[1][0] is empty")):
        texts_of(["a", "b", "", "c"], 4, 5, pairs)
    with pytest.raises(ValidationFailed, match=re.escape("input[1] has 6 characters")):
        texts_of(["a", "一" * 6], 2, 5, listed("input", ["a", "b"]))
    with pytest.raises(ValidationFailed, match="split the text into parts of at most 5 characters"):
        texts_of("一" * 6, 2, 5)


def test_an_empty_list_is_refused_by_its_field_saying_what_to_send() -> None:
    check_some(1, "pairs", "pair [a, b]")
    with pytest.raises(EmptyInput, match=re.escape("pairs is empty: send at least one pair [a, b]")):
        check_some(0, "pairs", "pair [a, b]")
    with pytest.raises(EmptyInput, match=re.escape("inputs is empty: send at least one input")):
        check_some(0, "inputs")
