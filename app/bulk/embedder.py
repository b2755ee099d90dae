"""The service's own engine for a bulk job: rows in, the vectors ``POST /embed`` returns for them out.

The same machinery as the server, built the way :mod:`app.serving.factory` builds it: the model, the
:class:`~app.engine.engine.Engine` (tokenisation thread, batch planner, inference thread) and the
:class:`~app.tasks.service.Service`, whose ``embeddings.vectors`` is the one way every vector is made
(prompts, windows of long texts, Dense modules, layer arithmetic, normalisation). The job keeps
``window`` texts in the engine at once, in calls of :data:`CALL_TEXTS`: the batch planner cuts each
batch from everything queued, grouped by length, so batches carry almost no padding, and a call's
answer comes back soon after its texts ran, so results stream out in order.

Bad rows never stop the job: a text the API would refuse is named by ``--text-field`` in the API's own
message (:func:`~app.tasks.options.texts_of`, :func:`~app.tasks.windows.check_length`, the engine's
"no tokens"), recorded and left out of the call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import numpy as np

from app.bulk.sources import Rows
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.errors import EmptyInput, InternalError, ValidationFailed
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings
from app.tasks.options import EmbedOptions, Names, prompt_text, texts_of
from app.tasks.service import Service
from app.tasks.windows import check_length
from app.telemetry.metrics import Metrics

# Texts per engine call: small, so that a call's answer is ready soon after its texts ran (results
# stream out in input order behind the oldest call), large enough that a call's own cost (a job, a
# future, a wake-up of the event loop) is small per text.
CALL_TEXTS = 64
# What to do about a text over the model's length, in the job's terms (the API's says what to send).
TOO_LONG_BULK = "run with --long-text truncate or --long-text chunk to embed it anyway"
# A text that cannot be embedded: what the row's refusal is, in the API's own words.
RowError = (EmptyInput, ValidationFailed)

T = TypeVar("T")


@dataclass
class Embedded:
    """One call's answer: the positions (in its rows) of the rows embedded, their vectors and tokens, and
    what is wrong with each of the others."""

    keep: list[int]
    vectors: np.ndarray  # float32 [len(keep), width]
    tokens: np.ndarray  # int32 [len(keep)]: [CLS], [SEP] and the prompt included, before any truncation
    bad: dict[int, str]


def engine_settings(settings: Settings, window: int) -> Settings:
    """``settings`` for the job's engine: room for ``window`` texts in flight, no cache, no warm-up."""
    room = window + 2 * CALL_TEXTS
    return settings.model_copy(
        update={
            "max_concurrent_inputs": max(room, settings.max_concurrent_inputs),
            "max_inputs_per_request": max(CALL_TEXTS, settings.max_inputs_per_request),
            "cache_bytes": 0,
            "redis_url": None,
            "warmup": False,
        }
    )


class Embedder:
    """The model, engine and service of one job (one per process, or per Ray actor)."""

    def __init__(
        self,
        settings: Settings,
        given: dict[str, Any],
        text_field: str,
        window: int,
        model: OnnxModel | None = None,
    ) -> None:
        """Load the model the settings name (unless ``model`` is given) and start the engine.

        Args:
            settings: the model, variant, providers, threads and batching, as the service reads them.
            given: the ``EmbedOptions`` fields given on the command line; the model's defaults for the rest.
            text_field: how messages name a text (``--text-field``).
            window: texts in the engine at once.

        Raises:
            ManifestError: the model cannot be loaded.
        """
        self.settings = engine_settings(settings, window)
        self.window = window
        self.field = text_field
        self.model = model if model is not None else load_model(self.settings)
        metrics = Metrics()
        self.engine = Engine(self.model, self.settings, metrics)
        self.engine.start()
        self.service = Service(
            self.settings, self.model, self.engine, VectorCache(None, None, metrics), metrics
        )
        self.service.ready = True
        self.options: EmbedOptions = replace(self.service.defaults, **given)
        self.width = self.service.embeddings.width  # until check(): the model's own width
        self._prompt = prompt_text(self.options.prompt_name, self.model.manifest.defaults.prompts) or ""

    def close(self) -> None:
        self.engine.stop()

    async def check(self) -> None:
        """Embed one text with the job's options, through the same path as every row: the options are
        checked against the model here, once, before any input is read, and the vectors' width learnt.

        Raises:
            ValidationFailed, Unsupported, EmptyInput: the options do not fit the model.
        """
        vectors, _, _ = await self.service.embeddings.vectors(
            ["检查"], self.options, self._names(), check_ready=False, use_cache=False
        )
        self.width = int(vectors.shape[1])  # concatenated layers make it a multiple of the model's

    async def stream(self, items: Iterable[tuple[T, Rows]]) -> AsyncIterator[tuple[T, Rows, Embedded]]:
        """Each item's rows embedded, in calls of at most :data:`CALL_TEXTS`, ``window`` texts in flight,
        yielded in order: (the item's tag, a call's rows, their answer)."""
        pending: deque[tuple[T, Rows, asyncio.Future[Embedded]]] = deque()
        queued = 0
        source = iter(items)
        broken: Exception | None = None
        try:
            while True:
                try:
                    tag, rows = next(source)
                except StopIteration:
                    break
                except Exception as exc:  # an unreadable input: what was read before it is still embedded
                    broken = exc
                    break
                for start in range(0, len(rows), CALL_TEXTS):
                    part = rows.slice(start, start + CALL_TEXTS) if len(rows) > CALL_TEXTS else rows
                    pending.append((tag, part, asyncio.ensure_future(self.embed(part))))
                    queued += len(part)
                    while queued > self.window:
                        tag_, done, future = pending.popleft()
                        queued -= len(done)
                        yield tag_, done, await future
            while pending:
                tag_, done, future = pending.popleft()
                yield tag_, done, await future
        finally:
            for _, _, future in pending:
                future.cancel()
        if broken is not None:
            raise broken

    async def embed(self, rows: Rows) -> Embedded:
        """The vectors of ``rows``' good texts; why each of the others is refused."""
        bad = dict(rows.bad)
        limit_chars = self.settings.max_input_chars
        todo: dict[int, str] = {}  # position → text, of the rows still to embed
        for i, text in enumerate(rows.texts):
            if text is None or i in bad:
                continue
            if not text or len(text) > limit_chars or text.isspace():  # what texts_of refuses
                bad[i] = self._refusal(partial(texts_of, text, 1, limit_chars, self._names()))
            else:
                todo[i] = text
        if self.options.long_text == "error":
            bad.update(await self._too_long(todo))
            todo = {i: t for i, t in todo.items() if i not in bad}
        while todo:
            named: list[int] = []  # which text a message named: ``Names.item`` is called for errors only
            texts = list(todo.values())
            try:
                vectors, _, tokens = await self.service.embeddings.vectors(
                    texts,
                    self.options,
                    Names(self.field, partial(_naming, named, self.field)),
                    TOO_LONG_BULK,
                    check_ready=False,
                    use_cache=False,
                    count_tokens=True,
                )
            except RowError as exc:
                if not named:  # not about one text: the options themselves (checked before any row)
                    raise
                refused = texts[named[-1]]  # and every other row of the same text
                bad.update((i, exc.message) for i, t in todo.items() if t == refused)
                todo = {i: t for i, t in todo.items() if t != refused}
                continue
            counts = np.fromiter((tokens[t] for t in texts), np.int32, len(texts))
            return Embedded(list(todo), vectors, counts, bad)
        return Embedded([], np.empty((0, self.width), np.float32), np.empty(0, np.int32), bad)

    async def _too_long(self, todo: dict[int, str]) -> dict[int, str]:
        """Under ``long_text`` "error", the texts over the model's length and their refusals, found before
        the call (one such text would refuse the whole call, and each retry tokenise the rest again).

        Only a text of more characters than the limit can have more tokens (a token is never less than a
        character), so only those are tokenised here; anything this misses, the call's own check refuses.
        """
        limit = self.model.tokenizer.max_length
        room = limit - 2 - len(self._prompt)
        long = [i for i, text in todo.items() if len(text) > room]
        if not long:
            return {}
        encodings, _ = await self.service.tokenize([self._prompt + todo[i] for i in long], offsets=False)
        return {
            i: self._refusal(partial(check_length, self.field, len(e.ids), limit, TOO_LONG_BULK))
            for i, e in zip(long, encodings, strict=True)
            if len(e.ids) > limit
        }

    def _names(self) -> Names:
        return Names(self.field, lambda _i: self.field)

    @staticmethod
    def _refusal(check: Callable[[], object]) -> str:
        """The message of the row error ``check()`` raises.

        Raises:
            InternalError: it raises none (the job's own test of a row disagrees with the service's).
        """
        try:
            check()
        except RowError as exc:
            return exc.message
        raise InternalError(f"{check} refuses nothing, yet the bulk job took its row for a bad one")


def _naming(named: list[int], field: str, index: int) -> str:
    """``Names.item`` of a call: notes which text a message names, and names it by the text field."""
    named.append(index)
    return field
