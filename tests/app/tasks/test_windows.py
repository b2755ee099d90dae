"""Long inputs: truncation and chunking windows, and how a pair is cut."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.tasks.windows import truncate_pair, truncated_positions, windows

CLS, SEP = 101, 102


def _ids(body: int) -> np.ndarray:
    return np.array([CLS, *range(1000, 1000 + body), SEP], dtype=np.int64)


def test_truncation_keeps_cls_sep_and_the_chosen_end() -> None:
    np.testing.assert_array_equal(truncated_positions(10, 5, "right"), [0, 1, 2, 3, 9])
    np.testing.assert_array_equal(truncated_positions(10, 5, "left"), [0, 6, 7, 8, 9])


def test_a_short_input_is_its_own_window() -> None:
    ids = _ids(3)
    (only,) = windows(ids, 8, "error", "right", CLS, SEP)
    assert only is ids


def test_truncate_and_chunk_windows() -> None:
    ids = _ids(10)  # 12 tokens, limit 6: 4 body tokens per window
    (cut,) = windows(ids, 6, "truncate", "left", CLS, SEP)
    np.testing.assert_array_equal(cut, [CLS, 1006, 1007, 1008, 1009, SEP])
    chunks = windows(ids, 6, "chunk", "right", CLS, SEP)
    assert [len(c) for c in chunks] == [6, 6, 4]
    assert all(c[0] == CLS and c[-1] == SEP for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c[1:-1] for c in chunks]), ids[1:-1])
    with pytest.raises(ValueError):
        windows(ids, 6, "error", "right", CLS, SEP)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_pair_is_cut_as_hugging_face_tokenizers_cut_it_longest_first(
    tiny_model_dir: Path, direction: str
) -> None:
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    plain.no_truncation()
    plain.no_padding()
    cut = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    cut.no_padding()
    rng = np.random.default_rng(3)
    chars = list("北京天气很好我们去公园散步吧这家餐厅的菜好吃")
    for _ in range(150):
        a = "".join(rng.choice(chars, size=int(rng.integers(1, 40))))
        b = "".join(rng.choice(chars, size=int(rng.integers(1, 40))))
        limit = int(rng.integers(8, 60))
        cut.enable_truncation(limit, strategy="longest_first", direction=direction)
        expected = cut.encode(a, b)
        whole = plain.encode(a, b)
        ids, types = truncate_pair(np.array(whole.ids), np.array(whole.type_ids), limit, direction)  # type: ignore[arg-type]
        assert (ids.tolist(), types.tolist()) == (expected.ids, expected.type_ids), (a, b, limit)
