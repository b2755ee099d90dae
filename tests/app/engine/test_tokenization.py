"""Tokenisation: one thread, many requests per encode_batch call, each gets its own encodings back; the
most urgent first (aged on the clock handed in), in calls of bounded characters; a queued request keeps
its permits."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, cast

import pytest

from app.engine.admission import Admission
from app.engine.priority import URGENCY
from app.engine.tokenization import CHARS_PER_CALL, INLINE_CHARS, Tokenization
from app.errors import Overloaded
from app.model.tokenizer import TextInput, TextTokenizer
from tests.app.engine.fake_clock import FakeClock

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


class Recording:
    """The tiny model's tokenizer, recording the texts of each ``encode_batch`` call; the first call waits
    for ``gate`` (and says it has begun with ``busy``), so that the test can queue requests behind it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: list[list[TextInput]] = []
        self.busy = threading.Event()
        self.gate = threading.Event()

    def encode_batch(
        self, texts: list[TextInput], add_special_tokens: bool = True, offsets: bool = True
    ) -> Any:
        self.busy.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        self.calls.append(list(texts))
        return self.tokenizer.encode_batch(texts, add_special_tokens, offsets)

    def encode_holding(self, texts: list[TextInput], add_special_tokens: bool = True) -> Any:
        return self.tokenizer.encode_holding(texts, add_special_tokens)


async def encode_at(stage: Tokenization, texts: list[TextInput], urgency: int) -> list[Any]:
    URGENCY.set(urgency)  # in this task only, as the API layer sets it in the request's
    return await stage.encode(texts, offsets=False)


def run_behind_a_blocker(
    recording: Recording, stage: Tokenization, requests: list[tuple[list[TextInput], int]]
) -> list[list[Any]]:
    """Encode ``requests`` (texts, urgency), queued in this order while the thread is busy with another
    request; their encodings."""

    async def main() -> list[list[Any]]:
        first = asyncio.ensure_future(encode_at(stage, [f"先来的{LONG * 2}"], 3))
        await asyncio.to_thread(recording.busy.wait, 10)  # the thread is encoding it: the rest queue
        queued = [asyncio.ensure_future(encode_at(stage, texts, u)) for texts, u in requests]
        await asyncio.sleep(0)  # all queued
        recording.gate.set()
        await first
        return await asyncio.gather(*queued)

    stage.start()
    try:
        return asyncio.run(main())
    finally:
        stage.stop()


def test_an_urgent_request_is_encoded_before_a_queued_background_one(tiny_model: Any) -> None:
    recording = Recording(tiny_model.tokenizer)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=10)
    background: list[TextInput] = [f"后台{i}{LONG}" for i in range(3)]
    urgent: list[TextInput] = [f"急{LONG * 2}"]
    run_behind_a_blocker(recording, stage, [(background, 7), (urgent, 0)])
    # Queued second, the urgent request's texts come first; the background one's may share its call.
    assert [t for call in recording.calls[1:] for t in call] == urgent + background


def test_a_queued_request_ages_on_the_clock_it_is_handed(tiny_model: Any) -> None:
    recording = Recording(tiny_model.tokenizer)
    clock = FakeClock(0.0)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=10, aging_ms=1000, clock=clock)
    background: list[TextInput] = [f"后台{i}{LONG}" for i in range(3)]
    urgent: list[TextInput] = [f"急{LONG * 2}"]

    async def main() -> None:
        first = asyncio.ensure_future(encode_at(stage, [f"先来的{LONG * 2}"], 3))
        await asyncio.to_thread(recording.busy.wait, 10)  # the thread is encoding it: the rest queue
        old = asyncio.ensure_future(encode_at(stage, background, 7))
        await asyncio.sleep(0)  # queued at 0.0
        clock.advance(10.0)  # ten aging steps on the clock handed in (none in real time)
        new = asyncio.ensure_future(encode_at(stage, urgent, 0))
        await asyncio.sleep(0)
        recording.gate.set()
        await asyncio.gather(first, old, new)

    stage.start()
    try:
        asyncio.run(main())
    finally:
        stage.stop()
    # Aged from 7 to -3, the background request is now the more urgent one.
    assert [t for call in recording.calls[1:] for t in call] == background + urgent


def test_no_call_encodes_more_than_its_bound_of_characters(tiny_model: Any) -> None:
    recording = Recording(tiny_model.tokenizer)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=10)
    texts: list[TextInput] = [f"长文{i}{LONG * 16}"[:4000] for i in range(20)]  # 80,000 characters
    (got,) = run_behind_a_blocker(recording, stage, [(texts, 3)])
    assert [t for call in recording.calls[1:] for t in call] == texts  # cut over calls, in order
    assert len(recording.calls) > 1 + 80_000 // CHARS_PER_CALL
    assert all(sum(map(len, cast(list[str], call))) <= CHARS_PER_CALL for call in recording.calls)
    assert stage.largest_call_chars <= CHARS_PER_CALL
    want = tiny_model.tokenizer.encode_batch(texts, offsets=False)
    assert [e.ids for e in got] == [e.ids for e in want]
    assert stage.pending_texts == 0


def test_a_queued_request_keeps_its_permits_until_the_thread_has_dropped_it(tiny_model: Any) -> None:
    recording = Recording(tiny_model.tokenizer)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=10)
    admission = Admission(limit=4)

    async def main() -> None:
        first = asyncio.ensure_future(encode_at(stage, [f"先来的{LONG * 2}"], 3))
        await asyncio.to_thread(recording.busy.wait, 10)
        with admission.try_acquire(2) as permits:
            gone = asyncio.ensure_future(stage.encode([f"走了{LONG * 2}"], held=permits))
            await asyncio.sleep(0)  # queued
            gone.cancel()  # its client left
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        assert admission.in_use == 2  # the request is over, its texts are still queued
        recording.gate.set()
        await first
        while admission.in_use:  # given back once the thread has dropped them
            await asyncio.sleep(0.01)

    stage.start()
    try:
        asyncio.run(asyncio.wait_for(main(), 60))  # bounded: permits never given back fail, not hang
    finally:
        stage.stop()
    assert len(recording.calls) == 1 and stage.pending_texts == 0  # the gone request's never encoded


def test_a_full_queue_refuses_with_overloaded(tiny_model: Any) -> None:
    """Only work that took no permits can find it full (admission keeps the rest under its capacity)."""
    recording = Recording(tiny_model.tokenizer)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=1)

    async def main() -> None:
        first = asyncio.ensure_future(encode_at(stage, [f"先来的{LONG * 2}"], 3))
        await asyncio.to_thread(recording.busy.wait, 10)  # taken out of the queue: it holds no entry
        queued = asyncio.ensure_future(stage.encode([f"排队{LONG * 2}"]))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="tokenisation queue"):
            await stage.encode([f"满了{LONG * 2}"])
        recording.gate.set()
        await asyncio.gather(first, queued)

    stage.start()
    try:
        asyncio.run(main())
    finally:
        stage.stop()


class FailingOn(Recording):
    """:class:`Recording`, raising for a call that holds a text starting with 坏."""

    def encode_batch(
        self, texts: list[TextInput], add_special_tokens: bool = True, offsets: bool = True
    ) -> Any:
        if any(isinstance(t, str) and t.startswith("坏") for t in texts):
            raise RuntimeError("the tokenizer failed")
        return super().encode_batch(texts, add_special_tokens, offsets)


def test_a_request_cut_over_calls_that_fails_leaves_its_queue_and_the_next_one_is_encoded(
    tiny_model: Any,
) -> None:
    recording = FailingOn(tiny_model.tokenizer)
    stage = Tokenization(cast(TextTokenizer, recording), capacity=10)
    cut: list[TextInput] = [f"长文{i}{LONG * 16}"[:4000] for i in range(12)]  # over three calls
    cut[5] = f"坏{cut[5]}"  # in its second: its third part is still queued when it fails
    behind: list[TextInput] = [f"后来的{LONG * 2}"]  # past the inline bound: on the thread

    async def main() -> tuple[BaseException | list[Any], ...]:
        first = asyncio.ensure_future(encode_at(stage, [f"先来的{LONG * 2}"], 3))
        await asyncio.to_thread(recording.busy.wait, 10)  # the thread is encoding it: the rest queue
        queued = [asyncio.ensure_future(encode_at(stage, texts, 3)) for texts in (cut, behind)]
        await asyncio.sleep(0)
        recording.gate.set()
        await first
        return tuple(await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 30))

    stage.start()
    try:
        failed, encoded = asyncio.run(main())
    finally:
        stage.stop()
    assert isinstance(failed, RuntimeError)
    assert isinstance(encoded, list)
    assert [e.ids for e in encoded] == [
        e.ids for e in tiny_model.tokenizer.encode_batch(behind, offsets=False)
    ]
    assert len(recording.calls) == 3  # the blocker, the cut request's first call, the one behind it
    assert stage.pending_texts == 0
