"""/embed_all's token rows (app.tasks.tokens): positions, returned rows, the answer bound, token descriptions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.errors import InternalError, ValidationFailed
from app.tasks.options import EmbedAllOptions, LayerMix
from app.tasks.tokens import check_token_bound, check_tokenize_bound, returned_rows, token_vectors


def test_rows_leave_out_special_tokens_unless_asked(tiny_model: Any) -> None:
    (enc,) = tiny_model.tokenizer.encode_batch(["你好"])  # [CLS] 你 好 [SEP]
    kept = np.arange(len(enc.ids))
    np.testing.assert_array_equal(returned_rows(enc, kept, special_tokens=False), [1, 2])
    np.testing.assert_array_equal(returned_rows(enc, kept, special_tokens=True), [0, 1, 2, 3])


def test_the_bound_counts_each_layer_held() -> None:
    check_token_bound(10, 2, 20)
    with pytest.raises(ValidationFailed, match=r"21 token vectors \(7 tokens × 3 layers held\)"):
        check_token_bound(7, 3, 20)
    with pytest.raises(ValidationFailed, match=r"send fewer or shorter inputs$"):
        check_token_bound(21, 1, 20)


def test_token_vectors_combine_normalise_and_describe(tiny_model: Any) -> None:
    (enc,) = tiny_model.tokenizer.encode_batch(["你好"])
    kept = np.arange(4)
    rows = np.array([1, 2])
    states = np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 4, 2) + 1  # [layers, tokens, hidden]
    options = EmbedAllOptions(normalize=True, return_tokens=True, norms=True)
    answer = token_vectors(enc, kept, rows, states, LayerMix("concat"), options)
    raw = np.concatenate([states[0, 1:3], states[1, 1:3]], axis=-1)
    assert answer.norms is not None
    np.testing.assert_allclose(answer.norms, np.linalg.norm(raw, axis=-1), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(answer.vectors, axis=-1), [1, 1], rtol=1e-6)
    assert answer.tokens is not None and [t["text"] for t in answer.tokens] == ["你", "好"]
    assert answer.tokens[0]["start"] == 0 and answer.tokens[1]["stop"] == 2
    bare = token_vectors(enc, kept, rows, states, LayerMix("mean"), EmbedAllOptions())
    assert bare.tokens is None and bare.norms is None
    with pytest.raises(InternalError):
        token_vectors(enc, kept, rows, None, LayerMix(), options)


def test_tokenize_refuses_more_tokens_than_its_bound(tiny_model: Any) -> None:
    encodings = tiny_model.tokenizer.encode_batch(["你好", "北京"])  # 4 tokens each
    check_tokenize_bound(encodings, 8)
    with pytest.raises(
        ValidationFailed, match=r"8 tokens; the limit is 7 per request \(max_tokenize_tokens\)"
    ):
        check_tokenize_bound(encodings, 7)
