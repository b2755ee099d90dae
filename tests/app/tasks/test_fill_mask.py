"""Fill-mask predictions, targets and answer shapes in the Hugging Face pipeline's terms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.errors import ValidationFailed
from app.tasks.fill_mask import Candidate, predictions, shaped, split_targets, target_ids

VOCAB = 21128  # bert-base-chinese's vocabulary


def masked(tiny_model: Any, positions: tuple[int, ...]) -> tuple[np.ndarray, list[int]]:
    """The ids of 北京是中国的首都 with ``positions`` masked, and the ids that were there."""
    (enc,) = tiny_model.tokenizer.encode_batch(["北京是中国的首都"])
    ids = np.asarray(enc.ids, dtype=np.int64)
    ids[list(positions)] = tiny_model.manifest.tokenizer.mask_id
    return ids, enc.ids


def test_each_mask_gets_its_top_k_with_the_filled_sequence(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    ids, original = masked(tiny_model, (2,))
    probs = np.zeros((1, VOCAB), dtype=np.float32)
    jing = int(original[2])
    other = 771
    probs[0, jing], probs[0, other] = 0.7, 0.2  # two candidates, most probable first
    (only,) = predictions(tokenizer, ids, (2,), probs, top_k=2)
    assert [p["token"] for p in only] == [jing, other]
    assert [p["score"] for p in only] == [np.float32(0.7).item(), np.float32(0.2).item()]
    assert only[0]["sequence"].replace(" ", "") == "北京是中国的首都"  # one mask: special tokens dropped
    assert only[0]["token_str"] == tokenizer.decode([jing], skip_special_tokens=False)


def test_with_several_masks_the_others_stay_visible(tiny_model: Any) -> None:
    ids, _ = masked(tiny_model, (1, 2))
    probs = np.full((2, VOCAB), 1 / VOCAB, dtype=np.float32)
    out = predictions(tiny_model.tokenizer, ids, (1, 2), probs, top_k=1)
    assert len(out) == 2 and all(len(p) == 1 for p in out)
    assert "[MASK]" in out[0][0]["sequence"] and "[CLS]" in out[0][0]["sequence"]


def test_targets_compete_alone_with_their_whole_vocabulary_probability(tiny_model: Any) -> None:
    ids, _ = masked(tiny_model, (2,))
    probs = np.zeros((1, VOCAB), dtype=np.float32)
    probs[0, 100], probs[0, 200], probs[0, 300] = 0.5, 0.1, 0.3  # 100 is the best, but no target
    (only,) = predictions(tiny_model.tokenizer, ids, (2,), probs, top_k=5, targets=np.array([200, 300]))
    # Capped at the two targets; scores are not renormalised over them (the pipeline's probs[..., ids]).
    assert [p["token"] for p in only] == [300, 200]
    assert [p["score"] for p in only] == [np.float32(0.3).item(), np.float32(0.1).item()]


def candidates(token: int) -> list[Candidate]:
    return [{"score": 1.0, "token": token, "token_str": "x", "sequence": "x"}]


def test_a_string_with_one_mask_answers_its_candidates() -> None:
    assert shaped([[candidates(1)]], one_text=True) == candidates(1)


def test_a_string_with_several_masks_answers_a_list_per_mask() -> None:
    assert shaped([[candidates(1), candidates(2)]], one_text=True) == [candidates(1), candidates(2)]


def test_a_list_answers_each_input_in_its_own_shape() -> None:
    answers = [[candidates(1)], [candidates(2), candidates(3)]]
    assert shaped(answers, one_text=False) == [candidates(1), [candidates(2), candidates(3)]]


def test_a_list_of_one_input_still_answers_a_list() -> None:
    # The pipeline would return the bare answer here; a client that sends a list reads a list.
    assert shaped([[candidates(1)]], one_text=False) == [candidates(1)]


def test_vocabulary_tokens_are_looked_up_and_the_rest_left_to_tokenise(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    known, unknown = split_targets(tokenizer, ["京", "北京", "[MASK]", " "])
    assert known == [tokenizer.token_to_id("京"), tiny_model.manifest.tokenizer.mask_id]
    assert unknown == ["北京", " "]


def test_a_tokenised_target_stands_for_its_first_token_and_an_empty_one_is_ignored() -> None:
    assert target_ids([7, 3], [[5, 9], []]).tolist() == [3, 5, 7]


def test_targets_are_distinct() -> None:
    assert target_ids([5, 5], [[5, 1]]).tolist() == [5]


def test_no_target_left_is_refused() -> None:
    with pytest.raises(ValidationFailed, match="none of the targets"):
        target_ids([], [[], []])


def old_predictions(
    tokenizer: Any, ids: np.ndarray, positions: tuple[int, ...], probs: np.ndarray, top_k: int
) -> list[list[Candidate]]:
    """The algorithm before issue 50: every candidate's whole sequence decoded."""
    from app.tasks.layers import top_k as top_k_of

    out = []
    for position, row in zip(positions, probs, strict=True):
        tokens, scores = top_k_of(row, top_k)
        filled_in = []
        for token, score in zip(tokens, scores, strict=True):
            filled = ids.copy()
            filled[position] = token
            filled_in.append(
                {
                    "score": score,
                    "token": token,
                    "token_str": tokenizer.decode([token], skip_special_tokens=False),
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=len(positions) == 1),
                }
            )
        out.append(filled_in)
    return out


@pytest.mark.parametrize("masks", [1, 128])
def test_the_largest_request_answers_as_before_without_decoding_a_sequence(
    tiny_model: Any, masks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tiny_model.tokenizer
    (enc,) = tokenizer.encode_batch(["北京是中国的首都" + "[MASK]" * masks], offsets=False)
    ids = np.asarray(enc.ids, dtype=np.int64)
    positions = tuple(int(p) for p in np.flatnonzero(ids == tiny_model.manifest.tokenizer.mask_id))
    probs = np.random.default_rng(5).random((masks, VOCAB), dtype=np.float32)
    probs[:, :106] += 1.0  # the special tokens and the first punctuation among the candidates
    expected = old_predictions(tokenizer, ids, positions, probs, top_k=50)
    decoded: list[int] = []
    decode = tokenizer.decode

    def counted(token_ids: list[int], skip_special_tokens: bool = True) -> str:
        decoded.append(len(token_ids))
        return decode(token_ids, skip_special_tokens)

    monkeypatch.setattr(tokenizer, "decode", counted)
    assert predictions(tokenizer, ids, positions, probs, top_k=50) == expected
    assert max(decoded) == 1  # only token_str, one token at a time: no candidate's whole sequence
