"""Stage 2, tokenisation: one thread turns queued texts into encodings, many requests per call.

Requests put their texts on a queue; the thread takes what is there, the most urgent request first
(:data:`app.engine.priority.URGENCY`, read when the request is queued; aged like the batch queue's, so
background work is encoded under any load), and encodes it in one ``encode_batch`` call of at most
:data:`CHARS_PER_CALL` characters, off the event loop, while the inference thread runs the previous batch:
a request longer than that is encoded over several calls, so an urgent request never waits behind more
than one call's worth of a background one's texts. Each entry keeps its request's permits
(:meth:`app.engine.admission.Permits.keep`) until it has left this stage, so admission alone bounds the
queue. Each request then gets its encodings in one of two ways: :meth:`Tokenization.encode` wakes the
event loop with them (for answers built from the tokens: /embed_all, fill-mask, /tokenize),
:meth:`Tokenization.then` hands them to a callback right here on this thread, which queues the request's
sequences for batching (/embed and the routes like it): the loop is not woken between tokenisation and
batching, so a request wakes it once, when its answer is ready. Every text of those routes goes through
this thread, however few a request sends: requests on their way here are the company the batch assembler
waits for (:attr:`Tokenization.pending_texts`); docs/performance.md has the measurements behind it.
``encode`` encodes a short request (:data:`INLINE_CHARS`) on the event loop instead, holding the GIL: it
would wake the loop anyway, and the two hops cost more than the encoding.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import Encoding

from app.engine.admission import Permits
from app.engine.clock import Clock
from app.engine.priority import URGENCIES, URGENCY, aged_level
from app.errors import Overloaded
from app.model.tokenizer import TextInputs, TextTokenizer

log = logging.getLogger(__name__)

# Texts encoded per call: large enough to amortise the call, small enough that one huge request does
# not hold up the next request's first encodings for long.
_TEXTS_PER_CALL = 256
# Characters encoded per call: what a more urgent request may wait behind. 0.3-1 µs a character measured
# on a shared core (docs/architecture.md), so ~5-16 ms, where 256 texts of max_input_chars took seconds;
# one 8,192-character text cost the same per character as a call of four, so the bound costs no
# throughput. A single text longer than this is encoded alone.
CHARS_PER_CALL = 16384
# Characters a request may hold and be encoded on the event loop, holding the GIL, without the hop to the
# thread and back: ~2 µs a character, so at most ~0.5 ms of the loop, where the two hops wait for the GIL
# for milliseconds while other threads run (a tagger's tail beside an embedder, docs/performance.md).
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
    urgency: int
    queued_at: float
    held: Permits | None  # its request's permits, kept until it has left this stage
    start: int = 0  # its first text not yet taken into a call
    encodings: list[Encoding] | None = None  # of its texts encoded so far, while it is cut over calls
    over: bool = False  # answered (done or failed) or dropped: out of the queue for good


class Tokenization:
    def __init__(
        self, tokenizer: TextTokenizer, capacity: int, aging_ms: float = 1000.0, clock: Clock | None = None
    ) -> None:
        """``capacity`` bounds the requests queued; the permits their entries keep hold the queue under it
        (one entry per request at a time). ``aging_ms``: a queued request counts one urgency level more
        urgent for each ``aging_ms`` it has waited (the batch queue's ``urgency_aging_ms``), read on
        ``clock`` (the engine's; default: real time)."""
        self._now = (clock or Clock()).now
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.aging_s = aging_ms / 1000
        self._cond = threading.Condition()
        self._waiting: list[deque[_Request]] = [deque() for _ in URGENCIES]  # FIFO per urgency
        self._entries = 0  # requests queued, partly encoded ones included
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="zhembed-tokenize", daemon=True)
        self.calls = 0
        self.inline_calls = 0
        self.largest_call_chars = 0  # the most characters one call has encoded (a text over the bound alone)
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
        """Encodings of ``texts``, in order, computed on the tokenisation thread, or here on the event loop
        when they are short (:data:`INLINE_CHARS`). ``offsets=False`` when no caller reads the tokens'
        character spans. ``held``: the request's permits, kept while its texts are queued here.

        Raises:
            Overloaded: the queue is full (only work that took no permits can find it so).
        """
        chars = _chars(texts)
        if len(texts) <= INLINE_CHARS and chars <= INLINE_CHARS:
            self.inline_calls += 1
            return self.tokenizer.encode_holding(texts, add_special_tokens)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Encoding]] = loop.create_future()
        self._put(
            texts,
            add_special_tokens,
            offsets,
            lambda part: loop.call_soon_threadsafe(_resolve, future, part),
            lambda exc: loop.call_soon_threadsafe(_fail, future, exc),
            lambda: not future.cancelled(),
            chars,
            held,
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
        """Encode ``texts`` ([CLS]/[SEP] added, no offsets) and call ``done`` with their encodings on the
        tokenisation thread, or ``failed`` if encoding raised; neither once ``wanted()`` is False. From the
        event loop; ``held`` as for :meth:`encode`.

        Raises:
            Overloaded: as :meth:`encode`.
        """
        self._put(texts, True, False, done, failed, wanted, sum(map(len, texts)), held)

    def _put(
        self,
        texts: TextInputs,
        add_special_tokens: bool,
        offsets: bool,
        done: Callable[[list[Encoding]], object],
        failed: Callable[[BaseException], object],
        wanted: Callable[[], bool],
        chars: int,
        held: Permits | None,
    ) -> None:
        urgency = URGENCY.get()
        request = _Request(
            texts, add_special_tokens, offsets, done, failed, wanted, chars, urgency,
            self._now(), held,
        )  # fmt: skip
        with self._cond:
            if self._entries >= self.capacity:
                raise Overloaded(f"the tokenisation queue holds {self._entries} requests; retry later")
            if held is not None:
                held.keep()
            self._waiting[urgency].append(request)
            self._entries += 1
            self._queued += len(texts)
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
            for special in (True, False):
                for offsets in (True, False):
                    group = [
                        p for p in parts if p[0].add_special_tokens is special and p[0].offsets is offsets
                    ]
                    if group:
                        self._encode(group, special, offsets)

    def _take(self, now: float) -> tuple[list[tuple[_Request, int, int]], list[_Request]]:
        """This call's texts, with the lock held: (request, first, end) parts, the most urgent request
        first (after aging), then the next, up to :data:`CHARS_PER_CALL` and :data:`_TEXTS_PER_CALL` (a
        request that does not fit is cut, and continues next call); and the requests that left, dropped."""
        parts: list[tuple[_Request, int, int]] = []
        gone: list[_Request] = []
        chars, texts, full = CHARS_PER_CALL, _TEXTS_PER_CALL, False
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
                    running = _running_chars(request.texts, first, min(left, texts))
                    fit = bisect.bisect_right(running, chars)
                    end = first + max(fit, 0 if parts else 1)
                    if end == first:  # not one more text fits
                        full = True
                        break
                    taken = running[end - first - 1]
                parts.append((request, first, end))
                request.start, request.chars = end, request.chars - taken
                chars, texts = chars - taken, texts - (end - first)
                if end == len(request.texts):
                    self._out(queue)
            if full or chars <= 0 or texts <= 0:
                break
        self.largest_call_chars = max(self.largest_call_chars, CHARS_PER_CALL - chars)
        return parts, gone

    def _out(self, queue: deque[_Request]) -> _Request:
        request = queue.popleft()
        self._entries -= 1
        return request

    def _leave(self, request: _Request) -> None:
        """The request has left this stage: its permits no longer kept for it here."""
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
                self._fail(r, exc)
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
                if r.encodings is None:
                    r.encodings = []
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

    def _fail(self, request: _Request, exc: BaseException) -> None:
        """Fail ``request`` once; a part of it still queued is dropped (counted done) with it."""
        if request.over:
            return
        with self._cond:
            if request.start < len(request.texts):  # still queued, at the head of its urgency's queue
                self._waiting[request.urgency].remove(request)
                self._entries -= 1
                self._done += len(request.texts) - request.start
                request.start = len(request.texts)
        request.failed(exc)
        self._leave(request)


def _text_chars(text: str | tuple[str, str]) -> int:
    return len(text) if isinstance(text, str) else len(text[0]) + len(text[1])


def _chars(texts: TextInputs) -> int:
    return sum(map(_text_chars, texts))


def _running_chars(texts: TextInputs, first: int, most: int) -> list[int]:
    """The characters of at most ``most`` texts from ``first`` on, summed up to each text (a request cut
    over calls only: at most a call's texts are read)."""
    return list(itertools.accumulate(map(_text_chars, itertools.islice(texts, first, first + most))))


def _resolve(future: asyncio.Future[list[Encoding]], value: list[Encoding]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[list[Encoding]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
