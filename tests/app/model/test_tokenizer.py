"""The serving tokenizer: no truncation, no padding, and decoding like the pipeline."""

from __future__ import annotations

from typing import Any


def test_long_texts_are_not_truncated_and_nothing_is_padded(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    long, short = tokenizer.encode_batch(["好" * (tokenizer.max_length + 50), "你好"])
    assert len(long.ids) == tokenizer.max_length + 52  # every token, [CLS] and [SEP] included
    assert len(short.ids) == 4


def test_special_tokens_are_optional_and_decode_round_trips(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    with_special, without = tokenizer.encode_batch(["北京"]), tokenizer.encode_batch(["北京"], False)
    assert with_special[0].ids[1:-1] == without[0].ids
    assert tokenizer.decode(with_special[0].ids).replace(" ", "") == "北京"
    assert "[CLS]" in tokenizer.decode(with_special[0].ids, skip_special_tokens=False)


def test_encoding_while_holding_the_gil_gives_what_a_batch_gives(tiny_model: Any) -> None:
    texts = ["北京是中国的首都。", ("北京是哪里？", "北京是中国的首都。"), "Hello, 世界! 123", ""]
    for special in (True, False):
        held = tiny_model.tokenizer.encode_holding(texts, add_special_tokens=special)
        batch = tiny_model.tokenizer.encode_batch(texts, add_special_tokens=special)
        for attribute in ("ids", "type_ids", "offsets", "special_tokens_mask", "attention_mask"):
            assert [getattr(e, attribute) for e in held] == [getattr(e, attribute) for e in batch], attribute
