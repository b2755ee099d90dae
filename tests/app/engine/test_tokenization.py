"""Tokenisation: one thread, many requests per encode_batch call, each gets its own encodings back."""

from __future__ import annotations

import asyncio
from typing import Any

from app.engine.tokenization import INLINE_CHARS, Tokenization
from app.model.tokenizer import TextInput

LONG = "北京是中国的首都，也是一座历史悠久的城市。" * (INLINE_CHARS // 20)  # past the inline bound alone


def test_requests_share_calls_and_get_their_own_encodings(tiny_model: Any) -> None:
    stage = Tokenization(tiny_model.tokenizer, capacity=100)
    texts = [[f"第{i}句话{LONG}", "你好"] for i in range(30)]

    async def main() -> list[Any]:
        return await asyncio.gather(*(stage.encode(t) for t in texts))

    stage.start()
    try:
        results = asyncio.run(main())
    finally:
        stage.stop()
    direct = [tiny_model.tokenizer.encode_batch(t) for t in texts]
    for got, want in zip(results, direct, strict=True):
        assert [e.ids for e in got] == [e.ids for e in want]
    assert stage.pending_texts == 0 and stage.calls < 30  # all 60 texts encoded, in fewer calls
    assert stage.inline_calls == 0


def test_short_requests_are_encoded_on_the_loop_as_the_thread_would(tiny_model: Any) -> None:
    stage = Tokenization(tiny_model.tokenizer, capacity=100)
    short: list[TextInput] = ["你好", ("北京是哪里？", "北京是中国的首都。")]
    at_bound: list[TextInput] = ["好" * (INLINE_CHARS - 1), "中"]
    past_bound: list[TextInput] = ["好" * INLINE_CHARS, "中"]

    async def main() -> list[Any]:
        return [
            await stage.encode(short),
            await stage.encode(at_bound),
            await stage.encode(short, offsets=False),
        ]

    stage.start()
    try:
        results = asyncio.run(main())
        assert stage.inline_calls == 3 and stage.calls == 0 and stage.pending_texts == 0
        asyncio.run(stage.encode(past_bound))  # one character more: through the thread
        assert stage.inline_calls == 3 and stage.calls == 1 and stage.pending_texts == 0
    finally:
        stage.stop()
    for got, (texts, offsets) in zip(results, [(short, True), (at_bound, True), (short, False)], strict=True):
        want = tiny_model.tokenizer.encode_batch(texts, offsets=offsets)
        assert [e.ids for e in got] == [e.ids for e in want]
        assert [e.type_ids for e in got] == [e.type_ids for e in want]
        if offsets:
            assert [e.offsets for e in got] == [e.offsets for e in want]


def test_without_offsets_the_ids_are_the_same(tiny_model: Any) -> None:
    texts = ["北京是中国的首都，也是一座历史悠久的城市。", "Hello, 世界! 123"]
    fast = tiny_model.tokenizer.encode_batch(texts, offsets=False)
    full = tiny_model.tokenizer.encode_batch(texts)
    assert [e.ids for e in fast] == [e.ids for e in full]
    assert [e.special_tokens_mask for e in fast] == [e.special_tokens_mask for e in full]
