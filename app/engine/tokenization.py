"""Stage 2, tokenisation: one thread encodes queued texts, the most urgent request first, many requests
per ``encode_batch`` call. Each entry keeps its request's permits until it has left this stage, so
admission alone bounds the queue. :meth:`Tokenization.then` hands the encodings to a callback on this
thread (which queues the sequences for batching without waking the loop); ``encode`` wakes the loop.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, islice

from tokenizers import Encoding

from app.engine.admission import Permits
from app.engine.clock import Clock
from app.engine.priority import URGENCIES, URGENCY, aged_level
from app.errors import Overloaded
from app.model.tokenizer import TextInputs, TextTokenizer

log = logging.getLogger(__name__)

# Texts per call: enough to amortise the call, few enough that a huge request holds up the next briefly.
_TEXTS_PER_CALL = 256
# Characters per call: what a more urgent request may wait behind, ~5-16 ms (docs/architecture.md), at no
# cost in throughput (one 8,192-character text cost per character what four did). A longer text goes alone.
CHARS_PER_CALL = 16384
# Characters a request may hold and be encoded on the event loop, holding the GIL: ~2 µs a character, so
# at most ~0.5 ms of the loop, where the two hops to the thread and back wait milliseconds for the GIL.
INLINE_CHARS = 256


@dataclass(eq=False, slots=True)
class _Request:
    texts: TextInputs
    add_special_tokens: bool
    offsets: bool
    done: Callable[[list[Encoding]], object]  # called on this thread with the request's encodings
    failed: Callable[[BaseException], object]  # called on this thread if encoding raised
    wanted: Callable[[], bool]  # False once the request is gone: its texts are skipped
    chars: int  # characters of its texts not yet taken into a call
    held: Permits | None  # its request's permits, kept until it has left this stage
    urgency: int = field(default_factory=URGENCY.get)  # the request's, read as it is queued
    queued_at: float = 0.0
    start: int = 0  # its first text not yet taken into a call
    encodings: list[Encoding] | None = None  # of its texts encoded so far, while it is cut over calls
    over: bool = False  # answered (done or failed) or dropped: out of the queue for good


class Tokenization:
    def __init__(
        self, tokenizer: TextTokenizer, capacity: int, aging_ms: float = 1000.0, clock: Clock | None = None
    ) -> None:
        """``capacity`` bounds the requests queued; ``aging_ms``: a queued request counts one urgency level
        more urgent for each ``aging_ms`` it has waited on ``clock`` (default: real time)."""
        self._now = (clock or Clock()).now
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.aging_s = aging_ms / 1000
        self._cond = threading.Condition()
        self._waiting: list[deque[_Request]] = [deque() for _ in URGENCIES]  # FIFO per urgency
        self._entries = 0  # requests queued, partly encoded ones included
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="zhembed-tokenize", daemon=True)
        self.calls = self.inline_calls = 0
        self.largest_call_chars = 0  # the most characters one call has encoded (a text over the bound alone)
        # Texts queued and texts done: each counter has one writer (the event loop, this thread), so
        # their difference is read without a lock by the batch assembler (pending_texts).
        self._queued = self._done = 0

    @property
    def pending_texts(self) -> int:
        """Texts queued or being encoded: the company the batch assembler waits for."""
        return self._queued - self._done

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Encode what is queued, then end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    async def encode(
        self,
        texts: TextInputs,
        add_special_tokens: bool = True,
        offsets: bool = True,
        held: Permits | None = None,
    ) -> list[Encoding]:
        """Encodings of ``texts``, from the thread, or here when short; raises Overloaded where the queue is
        full (only work that took no permits can find it so)."""
        chars = sum(map(_text_chars, texts))
        if len(texts) <= INLINE_CHARS and chars <= INLINE_CHARS:
            self.inline_calls += 1
            return self.tokenizer.encode_holding(texts, add_special_tokens)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Encoding]] = loop.create_future()

        def done(outcome: list[Encoding] | BaseException) -> None:  # on the tokenisation thread
            loop.call_soon_threadsafe(_settle, future, outcome)

        self._put(
            _Request(
                texts, add_special_tokens, offsets, done, done, lambda: not future.cancelled(), chars, held
            )
        )
        return await future

    def then(
        self,
        texts: list[str],
        done: Callable[[list[Encoding]], None],
        failed: Callable[[BaseException], None],
        wanted: Callable[[], bool],
        held: Permits | None = None,
    ) -> None:
        """Encode ``texts`` ([CLS]/[SEP] added, no offsets) and call ``done`` with their encodings on this
        thread, or ``failed`` if encoding raised; neither once ``wanted()`` is False."""
        self._put(_Request(texts, True, False, done, failed, wanted, sum(map(len, texts)), held))

    def _put(self, request: _Request) -> None:
        request.queued_at = self._now()
        with self._cond:
            if self._entries >= self.capacity:
                raise Overloaded(f"the tokenisation queue holds {self._entries} requests; retry later")
            if request.held is not None:
                request.held.keep()
            self._waiting[request.urgency].append(request)
            self._entries += 1
            self._queued += len(request.texts)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._entries and not self._stopped:
                    self._cond.wait()
                if not self._entries:
                    return
                parts, gone = self._take(self._now())
            for request in gone:  # its request left: its texts counted done, never encoded
                self._done += len(request.texts) - request.start
                self._leave(request)
            for special, offsets in ((True, True), (True, False), (False, True), (False, False)):
                group = [p for p in parts if p[0].add_special_tokens is special and p[0].offsets is offsets]
                if group:
                    self._encode(group, special, offsets)

    def _take(self, now: float) -> tuple[list[tuple[_Request, int, int]], list[_Request]]:
        """This call's (request, first, end) parts, most urgent first (a request that does not fit is cut,
        and continues next call), and the requests that left. With the lock held."""
        parts: list[tuple[_Request, int, int]] = []
        gone: list[_Request] = []
        chars, texts = CHARS_PER_CALL, _TEXTS_PER_CALL
        # Nothing is queued meanwhile (the lock is held): the order is decided once per call.
        order = sorted(
            (q for q in self._waiting if q),
            key=lambda q: (aged_level(q[0].urgency, q[0].queued_at, now, self.aging_s), q[0].urgency),
        )
        for queue in order:
            while queue and chars > 0 and texts > 0:
                request = queue[0]
                if not request.wanted():
                    gone.append(self._out(queue))
                    continue
                first, left = request.start, len(request.texts) - request.start
                if request.chars <= chars and left <= texts:
                    end, taken = len(request.texts), request.chars
                else:  # cut: as many of its texts as fit, and at least one in a call
                    most = islice(request.texts, first, first + min(left, texts))  # at most a call's texts
                    running = list(accumulate(map(_text_chars, most)))
                    fit = bisect.bisect_right(running, chars)
                    end = first + max(fit, 0 if parts else 1)
                    if end == first:  # not one more text fits: none may join this call
                        texts = 0
                        break
                    taken = running[end - first - 1]
                parts.append((request, first, end))
                request.start, request.chars = end, request.chars - taken
                chars, texts = chars - taken, texts - (end - first)
                if end == len(request.texts):
                    self._out(queue)
        self.largest_call_chars = max(self.largest_call_chars, CHARS_PER_CALL - chars)
        return parts, gone

    def _out(self, queue: deque[_Request]) -> _Request:
        request = queue.popleft()
        self._entries -= 1
        return request

    def _leave(self, request: _Request) -> None:
        request.over = True
        if request.held is not None:
            request.held.let_go()

    def _encode(
        self, parts: list[tuple[_Request, int, int]], add_special_tokens: bool, offsets: bool
    ) -> None:
        texts = [t for r, first, end in parts for t in r.texts[first:end]]
        try:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens, offsets)
        except Exception as exc:  # handed to the requests, which fail loudly; the thread lives on
            self._done += len(texts)
            for r, _, _ in parts:
                if r.over:  # failed in an earlier call
                    continue
                with self._cond:
                    if r.start < len(r.texts):  # its rest still queued, at the head of its urgency's queue
                        self._waiting[r.urgency].remove(r)  # by itself, not by where it is
                        self._entries -= 1
                        self._done += len(r.texts) - r.start
                r.failed(exc)
                self._leave(r)
            return
        self.calls += 1
        at = 0
        for r, first, end in parts:
            part = encodings[at : at + end - first]
            at += end - first
            # Counted done before its sequences are queued: the assembler, woken by them, must not wait
            # for company that is this very request.
            self._done += end - first
            if first or end < len(r.texts):  # cut over calls: gathered here
                r.encodings = r.encodings or []
                r.encodings.extend(part)
                part = r.encodings
            if end < len(r.texts) or r.over:  # more of it next call; or failed in an earlier call
                continue
            try:
                r.done(part)
            except Exception as exc:  # a callback's fault is its request's, not this thread's
                log.exception("tokenisation callback failed")
                r.failed(exc)
            self._leave(r)


def _text_chars(text: str | tuple[str, str]) -> int:
    return len(text) if isinstance(text, str) else len(text[0]) + len(text[1])


def _settle(future: asyncio.Future[list[Encoding]], outcome: list[Encoding] | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
