"""What a gRPC call may hold (app/api/rpc/limits.py): a client stream is read only up to the request
limits, and Tokenize and Decode take permits and do their work off the event loop.

In this process, without the generated modules (conftest.py says why): messages and the service are the
small fakes below, the admission budget a real one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.api.rpc.limits import decoded, max_tokens, stream_texts, tokenized
from app.engine.admission import Admission, Permits
from app.errors import Overloaded, ValidationFailed
from app.settings import Settings

SETTINGS = Settings(max_inputs_per_request=4, max_input_chars=16, max_concurrent_inputs=8)


@dataclass
class Message:
    text: str
    query: str = "问题"


@dataclass
class Recorded:
    """A client stream that records how many messages the server took from it."""

    messages: list[Message]
    read: int = 0

    async def __aiter__(self) -> AsyncIterator[Message]:
        for message in self.messages:
            self.read += 1
            yield message


def test_a_stream_of_more_texts_than_the_limit_is_refused_unread_past_it() -> None:
    stream = Recorded([Message(f"第{i}句") for i in range(100)])
    with pytest.raises(ValidationFailed, match="more than 4 texts in one stream; the limit is 4"):
        asyncio.run(stream_texts(stream.__aiter__(), SETTINGS))
    assert stream.read == 5  # the one over the limit, and nothing after it


def test_a_streamed_text_over_the_character_limit_ends_the_reading() -> None:
    stream = Recorded([Message("短"), Message("长" * 17), Message("后")])
    with pytest.raises(ValidationFailed, match=r"texts\[1\] has 17 characters; the limit is 16"):
        asyncio.run(stream_texts(stream.__aiter__(), SETTINGS))
    assert stream.read == 2


def test_a_stream_within_the_limits_gives_its_first_message_and_every_text() -> None:
    messages = [Message("甲", "问"), Message("乙", "别的"), Message("丙")]
    first, texts = asyncio.run(stream_texts(Recorded(messages).__aiter__(), SETTINGS))
    assert first is messages[0] and texts == ["甲", "乙", "丙"]


class Engine:
    def __init__(self, limit: int) -> None:
        self.admission = Admission(limit)
        self.held_while_tokenizing = 0

    def admit(self, inputs: int) -> Permits:
        return self.admission.try_acquire(inputs)

    async def tokenize(self, texts: list[str], add_special_tokens: bool) -> tuple[list[Any], float]:
        self.held_while_tokenizing = self.admission.in_use
        return [list(texts[0])], 0.0


@dataclass
class Tokenizer:
    """Decodes on whichever thread calls it, and says which."""

    threads: list[int] = field(default_factory=list)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.threads.append(threading.get_ident())
        return " ".join(str(i) for i in ids)


class Service:
    """The part of :class:`~app.tasks.service.Service` that Tokenize and Decode use."""

    def __init__(self, limit: int = 8) -> None:
        self.settings = SETTINGS
        self.engine = Engine(limit)
        self.tokenizer = Tokenizer()
        self.model = type("Model", (), {"tokenizer": self.tokenizer})()
        self.model.manifest = type("Manifest", (), {"config": type("Config", (), {"vocab_size": 100})()})()

    def check_ready(self) -> None:
        pass

    def texts(self, inputs: str, _names: Any) -> list[str]:
        return [inputs]


def test_decode_runs_off_the_event_loop_with_a_permit() -> None:
    service = Service()

    async def scenario() -> tuple[str, int]:
        return await decoded(service, [1, 2, 3], False), threading.get_ident()  # type: ignore[arg-type]

    text, loop_thread = asyncio.run(scenario())
    assert text == "1 2 3"
    assert service.tokenizer.threads and service.tokenizer.threads[0] != loop_thread
    assert service.engine.admission.in_use == 0


def test_decode_is_refused_when_the_budget_is_full() -> None:
    service = Service(limit=2)
    held = service.engine.admit(2)
    with pytest.raises(Overloaded, match="2 of 2 inputs in flight"):
        asyncio.run(decoded(service, [1], False))  # type: ignore[arg-type]
    held.release()
    assert not service.tokenizer.threads  # refused before any work


def test_decode_takes_no_more_ids_than_the_longest_input_has_tokens() -> None:
    service = Service()
    assert max_tokens(SETTINGS) == 18
    assert asyncio.run(decoded(service, [1] * 18, False))  # type: ignore[arg-type]
    with pytest.raises(ValidationFailed, match="19 ids in one Decode; the limit is 18"):
        asyncio.run(decoded(service, [1] * 19, False))  # type: ignore[arg-type]


def test_tokenize_builds_its_answer_off_the_event_loop_holding_its_permit() -> None:
    service = Service()
    built: list[tuple[int, int]] = []

    def answer(encoding: list[str]) -> int:
        built.append((threading.get_ident(), service.engine.admission.in_use))
        return len(encoding)

    async def scenario() -> tuple[int, int]:
        got = await tokenized(service, "北京", True, answer)  # type: ignore[arg-type]
        return got, threading.get_ident()

    got, loop_thread = asyncio.run(scenario())
    assert got == 2 and service.engine.held_while_tokenizing == 1
    ((thread, held),) = built
    assert thread != loop_thread and held == 1
    assert service.engine.admission.in_use == 0


def test_tokenize_is_refused_when_the_budget_is_full() -> None:
    service = Service(limit=1)
    held = service.engine.admit(1)
    with pytest.raises(Overloaded):
        asyncio.run(tokenized(service, "北京", True, len))  # type: ignore[arg-type]
    held.release()
    assert service.engine.held_while_tokenizing == 0  # never tokenised
