"""Token-id inputs: their forms (their checks are the preparation stage's: tests/app/tasks/test_prepare.py)."""

from __future__ import annotations

from app.tasks.token_ids import token_id_lists


def test_one_list_of_ids_is_one_input_and_texts_are_not_ids() -> None:
    one = token_id_lists([101, 7, 102])
    assert one is not None and one[0] == [[101, 7, 102]] and one[1].item(0) == "input"
    several = token_id_lists([[101, 102], [101, 8, 102]])
    assert (
        several is not None and several[0] == [[101, 102], [101, 8, 102]] and several[1].item(1) == "input[1]"
    )
    assert token_id_lists("你好") is None and token_id_lists(["你好"]) is None and token_id_lists([]) is None
