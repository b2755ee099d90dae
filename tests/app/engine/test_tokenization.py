"""Tokenisation: one thread, many requests per encode_batch call, each gets its own encodings back."""

from __future__ import annotations

import asyncio
from typing import Any

from app.engine.tokenization import Tokenization


def test_requests_share_calls_and_get_their_own_encodings(tiny_model: Any) -> None:
    stage = Tokenization(tiny_model.tokenizer, capacity=100)
    texts = [[f"第{i}句话", "你好"] for i in range(30)]

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


def test_without_offsets_the_ids_are_the_same(tiny_model: Any) -> None:
    texts = ["北京是中国的首都，也是一座历史悠久的城市。", "Hello, 世界! 123"]
    fast = tiny_model.tokenizer.encode_batch(texts, offsets=False)
    full = tiny_model.tokenizer.encode_batch(texts)
    assert [e.ids for e in fast] == [e.ids for e in full]
    assert [e.special_tokens_mask for e in fast] == [e.special_tokens_mask for e in full]
