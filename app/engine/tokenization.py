"""Stage 2, tokenisation: one thread turns queued texts into encodings, many requests per call.

Requests put their texts on a bounded queue; the thread drains what is there and encodes it in one
``encode_batch`` call, off the event loop, while the inference thread runs the previous batch. Each
request then gets its encodings in one of two ways: :meth:`Tokenization.encode` wakes the event loop
with them (for answers built from the tokens: /embed_all, fill-mask, /tokenize), :meth:`Tokenization.then`
hands them to a callback right here on this thread, which queues the request's sequences for batching
(/embed and the routes like it): the loop is not woken between tokenisation and batching, so a request
wakes it once, when its answer is ready. Every text of those routes goes through this thread, however few
a request sends: requests on their way here are the company the batch assembler waits for
(:attr:`Tokenization.pending_texts`); docs/performance.md has the measurements behind it. ``encode``
encodes a short request (:data:`INLINE_CHARS`) on the event loop instead, holding the GIL: it would wake
the loop anyway, and the two hops cost more than the encoding.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import Encoding

from app.model.tokenizer import TextInputs, TextTokenizer

log = logging.getLogger(__name__)

# Texts encoded per call: large enough to amortise the call, small enough that one huge request does
# not hold up the next request's first encodings for long.
_TEXTS_PER_CALL = 256
# Characters a request may hold and be encoded on the event loop, holding the GIL, without the hop to the
# thread and back: ~2 µs a character, so at most ~0.5 ms of the loop, where the two hops wait for the GIL
# for milliseconds while other threads run (a tagger's tail beside an embedder, docs/performance.md).
INLINE_CHARS = 256


@dataclass
class _Request:
    texts: TextInputs
    add_special_tokens: bool
    offsets: bool
    done: Callable[[list[Encoding]], object]  # called on this thread with the request's encodings
    failed: Callable[[BaseException], object]  # called on this thread if encoding raised
    wanted: Callable[[], bool]  # False once the request is gone: its texts are skipped


class Tokenization:
    def __init__(self, tokenizer: TextTokenizer, capacity: int) -> None:
        """``capacity`` bounds the queue; admission keeps it from ever filling (one entry per request)."""
        self.tokenizer = tokenizer
        self._requests: queue.Queue[_Request | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="zhembed-tokenize", daemon=True)
        self.calls = 0
        self.inline_calls = 0
        # Texts queued and texts done: each counter has one writer (the event loop, this thread), so
        # their difference is read without a lock by the batch assembler (pending_texts).
        self._queued = 0
        self._done = 0

    @property
    def pending_texts(self) -> int:
        """Texts queued or being encoded, whose sequences may soon reach the batch queue."""
        return self._queued - self._done

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join(timeout=10)

    async def encode(
        self, texts: TextInputs, add_special_tokens: bool = True, offsets: bool = True
    ) -> list[Encoding]:
        """Encodings of ``texts``, in order, computed on the tokenisation thread, or here on the event loop
        when they are short (:data:`INLINE_CHARS`). ``offsets=False`` when no caller reads the tokens'
        character spans."""
        if len(texts) <= INLINE_CHARS and _chars(texts) <= INLINE_CHARS:
            self.inline_calls += 1
            return self.tokenizer.encode_holding(texts, add_special_tokens)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Encoding]] = loop.create_future()
        self._put(
            _Request(
                texts,
                add_special_tokens,
                offsets,
                lambda part: loop.call_soon_threadsafe(_resolve, future, part),
                lambda exc: loop.call_soon_threadsafe(_fail, future, exc),
                lambda: not future.cancelled(),
            )
        )
        return await future

    def then(
        self,
        texts: list[str],
        done: Callable[[list[Encoding]], None],
        failed: Callable[[BaseException], None],
        wanted: Callable[[], bool],
    ) -> None:
        """Encode ``texts`` ([CLS]/[SEP] added, no offsets) and call ``done`` with their encodings on the
        tokenisation thread, or ``failed`` if encoding raised; neither once ``wanted()`` is False. From the
        event loop."""
        self._put(_Request(texts, True, False, done, failed, wanted))

    def _put(self, request: _Request) -> None:
        # Never blocks: admission bounds the requests in flight below the queue's capacity.
        self._requests.put_nowait(request)
        self._queued += len(request.texts)

    def _run(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            requests = [request]
            count = len(request.texts)
            while count < _TEXTS_PER_CALL:
                try:
                    more = self._requests.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._requests.put(None)  # stop after this round
                    break
                requests.append(more)
                count += len(more.texts)
            for special in (True, False):
                for offsets in (True, False):
                    group = [r for r in requests if r.add_special_tokens is special and r.offsets is offsets]
                    if group:
                        self._encode(group, special, offsets)

    def _encode(self, requests: list[_Request], add_special_tokens: bool, offsets: bool) -> None:
        live: list[_Request] = []
        for r in requests:
            if r.wanted():
                live.append(r)
            else:  # its request is gone: counted done, never encoded
                self._done += len(r.texts)
        if not live:
            return
        texts = [t for r in live for t in r.texts]
        try:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens, offsets)
        except Exception as exc:  # handed to the requests, which fail loudly; the thread lives on
            self._done += len(texts)
            for r in live:
                r.failed(exc)
            return
        self.calls += 1
        start = 0
        for r in live:
            part = encodings[start : start + len(r.texts)]
            start += len(r.texts)
            # Counted done before its sequences are queued: the assembler, woken by them, must not wait
            # for company that is this very request.
            self._done += len(r.texts)
            try:
                r.done(part)
            except Exception as exc:  # a callback's fault is its request's, not this thread's
                log.exception("tokenisation callback failed")
                r.failed(exc)


def _chars(texts: TextInputs) -> int:
    return sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in texts)


def _resolve(future: asyncio.Future[list[Encoding]], value: list[Encoding]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[list[Encoding]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
