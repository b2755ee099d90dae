"""What a gRPC call may hold, and the calls whose work leaves the event loop.

HTTP reads a whole body under ``max_body_bytes`` and checks its inputs against the request limits; a
client stream has no body, so :func:`stream_texts` reads it a message at a time and stops at the first that
passes a limit, with the HTTP route's error (INVALID_ARGUMENT, the one table's row for its 422). TEI's
``Tokenize`` and ``Decode`` are admitted like any other call (a permit per input) and do their work off the
loop: the tokenisation thread encodes, one thread of this module builds the answer or decodes, so that the
longest input allowed holds the loop for no more than a hand-off (:mod:`app.api.rpc.tei`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from tokenizers import Encoding

from app.errors import ValidationFailed
from app.settings import Settings
from app.tasks.options import listed
from app.tasks.prepare import text_problem
from app.tasks.service import Service
from app.tasks.tokens import check_tokenize_bound

T = TypeVar("T")

# One thread builds answers and decodes for every call of the process, one at a time: the work holds the
# GIL (protobuf messages, tokenizers' decode), and several threads that hold it starve the event loop more
# than one does (the loop waits for at most one holder's switch interval, not a convoy of them).
_ANSWERS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zhembed-rpc-answers")


async def off_loop(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` on the answers' thread (:data:`_ANSWERS`), awaited."""
    return await asyncio.get_running_loop().run_in_executor(_ANSWERS, work, *args)


# [CLS] and [SEP]: what Tokenize adds to an input's own tokens.
SPECIAL_TOKENS = 2


class HasText(Protocol):
    text: str


M = TypeVar("M", bound=HasText)


def max_tokens(settings: Settings) -> int:
    """The most token ids one ``Decode`` takes, and one ``Tokenize`` answers: those of the longest input
    allowed (``max_input_chars``; a WordPiece token covers at least one character) and its [CLS] and [SEP],
    and never more than ``POST /tokenize`` answers (``max_tokenize_tokens``)."""
    return min(settings.max_input_chars + SPECIAL_TOKENS, settings.max_tokenize_tokens)


async def stream_texts(messages: AsyncIterator[M], settings: Settings) -> tuple[M | None, list[str]]:
    """The first of ``messages`` and the ``text`` of each, read until the stream ends or a message passes
    a request limit, which ends the reading: nothing after it is read.

    Raises:
        ValidationFailed: more texts than ``max_inputs_per_request``, or one over ``max_input_chars``.
        EmptyInput: an empty or whitespace-only text.
    """
    first: M | None = None
    texts: list[str] = []
    name = listed("texts", texts).item
    async for message in messages:
        if len(texts) == settings.max_inputs_per_request:
            raise ValidationFailed(
                f"more than {settings.max_inputs_per_request} texts in one stream; the limit is "
                f"{settings.max_inputs_per_request} (ZHEMBED_MAX_INPUTS_PER_REQUEST), as for texts in one "
                "request: send them in several streams"
            )
        if (problem := text_problem(message.text, settings.max_input_chars, name, len(texts))) is not None:
            raise problem
        first = message if first is None else first
        texts.append(message.text)
    return first, texts


async def tokenized(
    service: Service, text: str, add_special_tokens: bool, answer: Callable[[Encoding], T]
) -> T:
    """``answer`` of ``text``'s encoding, as ``POST /tokenize`` checks and admits it (one permit, held until
    the answer is built), encoded on the tokenisation thread and answered on a worker thread.

    Raises:
        ValidationFailed, EmptyInput: ``text`` passes ``max_input_chars`` or ``max_tokenize_tokens``, or
            has no tokens to give.
        Overloaded: the budget is full.
    """
    service.check_ready()
    texts = service.texts(text, listed("inputs", text))
    with service.engine.admit(len(texts)):
        (encoding,), _ = await service.engine.tokenize(texts, add_special_tokens)
        check_tokenize_bound([encoding], service.settings.max_tokenize_tokens)
        return await off_loop(answer, encoding)


async def decoded(service: Service, ids: Sequence[int], skip_special_tokens: bool) -> str:
    """The text of token ``ids``, with one permit, decoded on a worker thread.

    Raises:
        ValidationFailed: more ids than :func:`max_tokens`, or one outside the vocabulary.
        Overloaded: the budget is full.
    """
    limit = max_tokens(service.settings)
    if len(ids) > limit:
        raise ValidationFailed(
            f"{len(ids)} ids in one Decode; the limit is {limit}, the tokens of the longest input "
            "(ZHEMBED_MAX_INPUT_CHARS) and its [CLS] and [SEP], at most ZHEMBED_MAX_TOKENIZE_TOKENS: decode "
            "them in parts"
        )
    with service.engine.admit(1):
        return await off_loop(_decode, service, ids, skip_special_tokens)


def _decode(service: Service, ids: Sequence[int], skip_special_tokens: bool) -> str:
    vocab = service.model.manifest.config.vocab_size
    if (bad := next((i for i in ids if i >= vocab), None)) is not None:
        raise ValidationFailed(f"id {bad} is outside the vocabulary (0..{vocab - 1})")
    return service.model.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
