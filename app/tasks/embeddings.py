"""Embeddings and similarity: a vector per input (``/embed``, ``POST /``, OpenAI's ``/v1/embeddings``)
and cosines of those vectors (``/similarity``).

The way every vector is made: the texts (with the model's prompt), through the vector cache when there
is one (:mod:`app.cache.vectors`), what it lacks tokenised and prepared into sequences on the tokenisation
thread (:mod:`app.tasks.prepare`: refusals, truncation, windows for long texts), pooled by the engine, through the model's
Dense modules (:mod:`app.model.dense`), then combined across layers and windows and normalised
(:mod:`app.tasks.layers`); and last, with ``dimensions``, cut to their first components and normalised
again (Matryoshka), after the cache, which keeps whole vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app.engine.work import Need, Planned
from app.errors import InternalError, ServiceError, ValidationFailed
from app.model import dense
from app.tasks import layers
from app.tasks.answers import Answer, Spent, timed
from app.tasks.core import Core, Packing
from app.tasks.options import (
    EmbedOptions,
    Names,
    Resolved,
    check_dimensions,
    check_prompt_fits,
    listed,
    matryoshka_of,
    prompt_text,
    resolve_embed,
    vector_key,
)
from app.tasks.prepare import (
    TOO_LONG_EMBED,
    TOO_LONG_OPENAI,
    GivenIds,
    Name,
    Prepared,
    Rules,
    check_some,
    from_encodings,
    given_ids,
    prepare,
    text_problems,
)
from app.tasks.token_ids import token_id_lists
from app.telemetry.timings import Timings, ms

_Pair = tuple[np.ndarray, np.ndarray]  # vectors [inputs, width] float32 and their inputs' tokens (int64)


@dataclass
class Vectors:
    """The vectors of a call (:meth:`Embeddings.vectors`, :meth:`Embeddings.rows`).

    ``vectors``: float32 [inputs embedded, width], or their first ``dimensions`` components;
    ``tokens``: int64 [inputs embedded], each one's tokens ([CLS], [SEP] and the prompt included, before
    any truncation); ``problems``: why each other input is refused, by its index (only :meth:`rows`
    leaves inputs out; the rest are embedded, in input order); ``timings``: of what was computed.
    """

    vectors: np.ndarray
    tokens: np.ndarray
    timings: Timings
    problems: dict[int, ServiceError] = field(default_factory=dict)


def _unpack(stored: list[np.ndarray]) -> _Pair:
    """Cache entries (a vector, then its input's tokens) as the vectors and the tokens."""
    rows = np.stack(stored)
    return np.ascontiguousarray(rows[:, :-1]), rows[:, -1].astype(np.int64)


_CALLS = 256  # distinct options resolved and kept (a full map starts again)


@dataclass(frozen=True)
class _Call:
    """A call's options resolved against the model once: what each sequence needs, how a long input is
    prepared, and what vectors come out."""

    options: EmbedOptions
    resolved: Resolved
    need: Need
    rules: Rules
    prompt: str  # put before each text; "" for none (and for token ids)
    width: int  # of the whole vectors (layers side by side widen them)
    # Through the cache (:func:`~app.tasks.options.vector_key`), each entry is the whole vector and its
    # input's tokens, so that a hit is counted without tokenising it again (exact in float32 below 2**24).
    packing: Packing[_Pair, _Pair]


class Embeddings:
    """The embedding task over the shared :class:`~app.tasks.core.Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core
        m = core.model.manifest
        self.dense = dense.load(core.model.folder, m.defaults.dense)
        # The width of the vectors: the encoder's hidden size, or the last Dense module's output.
        self.width = dense.width(m.defaults.dense, m.config.hidden_size)
        self.matryoshka = matryoshka_of(m.defaults)
        # Prompt name → its text and the tokens it takes ([CLS] and the prompt's own, not [SEP]: how
        # sentence-transformers counts the positions that include_prompt false leaves out of the pooling).
        prompts = m.defaults.prompts
        encoded = core.model.tokenizer.encode_batch(list(prompts.values()), offsets=False) if prompts else []
        self.prompt_tokens = {name: len(e.ids) - 1 for name, e in zip(prompts, encoded, strict=True)}
        self._calls: dict[tuple[EmbedOptions, str, bool], _Call] = {}

    @timed
    async def embed(self, inputs: str | list[str], options: EmbedOptions) -> Answer[np.ndarray]:
        """One float32 vector per input, in input order: [inputs, width]."""
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        self.core.check_ready()
        got = await self.vectors(texts, options, names)
        return Answer(got.vectors, got.timings)

    @timed
    async def openai(
        self, inputs: str | list[str] | list[int] | list[list[int]], dimensions: int | None
    ) -> Answer[tuple[np.ndarray, int]]:
        """The OpenAI-compatible call: default options, one vector per input, and the tokens counted.

        ``inputs`` are texts, or token ids run as given, as TEI runs them (:mod:`app.tasks.token_ids`).

        Returns:
            The vectors and the inputs' tokens ([CLS] and [SEP] included).

        Raises:
            ValidationFailed: a ``dimensions`` the model cannot give (:func:`check_dimensions`); an id out
                of the vocabulary; an input over the model's length; over the per-request limits.
            EmptyInput: no inputs, or an empty one.
        """
        options = replace(self.core.defaults, dimensions=dimensions)
        if (id_inputs := token_id_lists(inputs)) is not None:
            sequences, names = id_inputs
            given, problems = given_ids(
                sequences,
                self.core.rules(TOO_LONG_OPENAI),
                names,
                self.core.settings.max_inputs_per_request,
                self.core.model.manifest.config.vocab_size,
            )
            if problems:
                raise problems[min(problems)]
            self.core.check_ready()
            got = await self.vectors(given, options, names, TOO_LONG_OPENAI)
        else:
            names = listed("input", inputs)
            texts = self.core.texts(cast(str | list[str], inputs), names)
            self.core.check_ready()
            got = await self.vectors(texts, options, names, TOO_LONG_OPENAI)
        return Answer((got.vectors, int(got.tokens.sum())), got.timings)

    @timed
    async def similarity(
        self,
        source: str | None,
        sentences: list[str] | None,
        pairs: list[list[str]] | None,
        options: EmbedOptions,
    ) -> Answer[list[float]]:
        """Cosine of ``source`` with each of ``sentences``, or of each pair (of their first ``dimensions``
        components, when the options say so: the root route's similarity form)."""
        options = replace(options, normalize=True)
        if pairs is not None:
            check_some(len(pairs), "pairs", "pair [a, b]")
            names = Names("pairs", lambda k: f"pairs[{k // 2}][{k % 2}]")
            texts = self.core.texts([t for pair in pairs for t in pair], names)
        else:
            if source is None or sentences is None:
                raise ValidationFailed("give inputs.source_sentence and inputs.sentences, or pairs")
            check_some(len(sentences), "inputs.sentences", "sentence to compare with")
            names = Names(
                "inputs", lambda k: "inputs.source_sentence" if k == 0 else f"inputs.sentences[{k - 1}]"
            )
            texts = self.core.texts([source, *sentences], names)
        self.core.check_ready()
        got = await self.vectors(texts, options, names)
        vectors = got.vectors
        if pairs is not None:
            scores = np.einsum("ij,ij->i", vectors[0::2], vectors[1::2])
        else:
            scores = vectors[1:] @ vectors[0]
        return Answer(scores.astype(float).tolist(), got.timings)

    async def vectors(
        self,
        inputs: list[str] | GivenIds,
        options: EmbedOptions,
        names: Names,
        too_long: str = TOO_LONG_EMBED,
    ) -> Vectors:
        """The combined (and optionally normalised) float32 vector of each input, through the cache when
        there is one; with ``options.dimensions``, its first components (normalised again if
        ``options.normalize``). A request's call: its first bad input refuses it.

        ``inputs`` are texts (the model's prompt is put before each), or token ids that run as given.
        ``names`` name the inputs in error messages, ``too_long`` says what to do about one over the
        model's length.

        Raises:
            EmptyInput, ValidationFailed: the first input with no tokens or over the model's length
                (long_text "error"); options that do not fit the model.
        """
        given = inputs if isinstance(inputs, GivenIds) else None
        call = self._call(options, too_long, token_ids=given is not None)
        if given is not None:
            keys = given.keys
            ids_of = dict(zip(keys, given.ids, strict=True))
        else:
            texts = cast(list[str], inputs)
            keys = [call.prompt + t for t in texts] if call.prompt else texts
        spent = Spent()

        async def compute(todo: list[str], first: Callable[[int], int]) -> tuple[np.ndarray, np.ndarray]:
            runs: list[str] | list[np.ndarray] = [ids_of[k] for k in todo] if given is not None else todo
            vectors, prepared = await self._compute(call, runs, lambda i: names.item(first(i)), spent)
            return vectors, prepared.tokens

        vectors, tokens = await self.core.cached(keys, compute, call.packing)
        return Vectors(self._cut(vectors, options), tokens, spent.timings())

    async def rows(self, texts: list[str], options: EmbedOptions, names: Names, too_long: str) -> Vectors:
        """Each text's vector, or why it is refused: the bulk job's call (and the warm-up's). Nothing is
        cached; a text a request would be refused for (:func:`~app.tasks.prepare.text_problems`, no
        tokens, over the model's length with long_text "error") is left out and its problem kept, in
        the words a request gets, while the others are embedded: one engine call, whatever is wrong.

        Raises:
            ValidationFailed, Unsupported: options that do not fit the model.
        """
        call = self._call(options, too_long, token_ids=False)
        problems = text_problems(texts, self.core.settings.max_input_chars, names.item)
        keys = [call.prompt + t for t in texts] if call.prompt else texts
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            if i not in problems:
                first.setdefault(key, i)
        distinct = list(first)
        spent = Spent()
        if not distinct:
            empty = np.empty((0, call.width), np.float32)
            return Vectors(self._cut(empty, options), np.empty(0, np.int64), spent.timings(), problems)
        with self.core.engine.admit(len(distinct)):
            vectors, prepared = await self._compute(
                call, distinct, lambda k: names.item(first[distinct[k]]), spent, refuse=False
            )
        # A distinct text's row among the vectors (or its problem), for each text of the call.
        index = {key: d for d, key in enumerate(distinct)}
        row = dict(zip(prepared.inputs.tolist(), range(len(prepared.inputs)), strict=True))
        at: list[int] = []
        for i, key in enumerate(keys):
            if i in problems:
                continue
            d = index[key]
            if d in row:
                at.append(row[d])
            else:  # refused in the engine call, and so is every other row of the same text
                problems[i] = prepared.problems[d]
        return Vectors(
            self._cut(vectors[at], options),
            prepared.tokens[at],
            spent.timings(),
            problems,
        )

    def _call(self, options: EmbedOptions, too_long: str, token_ids: bool) -> _Call:
        """``options`` resolved against the model, once per distinct options: a request's options are
        mostly the defaults, and resolving them costs more than the rest of a one-text request's own work.
        At most :data:`_CALLS` are kept.

        Raises:
            ValidationFailed, Unsupported: options that do not fit the model (or its prompts).
        """
        key = (options, too_long, token_ids)
        if (call := self._calls.get(key)) is None:
            call = self._resolve(options, too_long, token_ids)
            if len(self._calls) >= _CALLS:
                self._calls.clear()
            self._calls[key] = call
        return call

    def _resolve(self, options: EmbedOptions, too_long: str, token_ids: bool) -> _Call:
        resolved = resolve_embed(options, self.core.model.num_layers, self.core.model.has_pooler)
        width = self.width * len(resolved.layers) if resolved.mix.how == "concat" else self.width
        check_dimensions(options.dimensions, width, self.matryoshka)
        # Token ids run as given: [CLS] [SEP] alone is the sender's to send.
        rules = self.core.rules(
            too_long, options.long_text, options.truncation_direction, refuse_empty=not token_ids
        )
        pool_from = 0
        prompt = ""
        if not token_ids and (
            text := prompt_text(options.prompt_name, self.core.model.manifest.defaults.prompts)
        ):
            prompt = text
            # [CLS] and the prompt: truncation keeps them whichever end it cuts, as encode keeps a prompt.
            keep = self.prompt_tokens[cast(str, options.prompt_name)]
            check_prompt_fits(cast(str, options.prompt_name), keep, rules.limit)
            rules = replace(rules, keep=keep)
            if not self.core.model.manifest.defaults.include_prompt:
                pool_from = keep
                if options.long_text == "chunk":
                    raise ValidationFailed(
                        "long_text 'chunk' cannot go with this model's prompts: its pooling leaves the prompt "
                        "out, and only the first window holds it; use long_text 'truncate'"
                    )
        space = self.core.key_space(**vector_key(options, resolved, token_ids))
        return _Call(
            options,
            resolved,
            Need(layers=resolved.layers, pooling=options.pooling, pool_from=pool_from),
            rules,
            prompt,
            width,
            Packing(
                lambda: space,
                width + 1,
                lambda got: np.column_stack([got[0], got[1].astype(np.float32)]),
                _unpack,
                lambda got, at: got if at is None else (got[0][at], got[1][at]),
            ),
        )

    async def _compute(
        self,
        call: _Call,
        inputs: list[str] | list[np.ndarray],
        name: Name,
        spent: Spent,
        refuse: bool = True,
    ) -> tuple[np.ndarray, Prepared]:
        """One engine call: the vectors [good inputs, width] of ``inputs`` (texts, tokenised and prepared
        on the tokenisation thread; or token ids), and how they were prepared. ``refuse``: the first
        bad input fails the call (a request's); else bad inputs are left out, their problems kept."""

        def plan(encodings: list[TokenEncoding]) -> Planned:  # on the tokenisation thread
            prepared = from_encodings(encodings, call.rules, name)
            if refuse:
                prepared.refuse()
            return Planned(prepared.ids, call.need, prepared)

        if inputs and isinstance(inputs[0], np.ndarray):  # token ids, checked: nothing to tokenise
            prepared = prepare(inputs, call.rules, name)
            prepared.refuse()
            job = await self.core.run(prepared.ids, call.need)
        else:
            job = await self.core.engine.run_texts(cast(list[str], inputs), plan)
            spent.tokenization_ms += ms(job.tokenized_s)
            prepared = cast(Prepared, job.context)
        spent.jobs.append(job)
        if not prepared.ids:  # every input refused (rows only): nothing ran
            return np.empty((0, call.width), np.float32), prepared
        if job.vectors is None:
            raise InternalError("an /embed job came back without its pooled vectors")
        pooled = dense.apply(job.vectors, self.dense) if self.dense else job.vectors
        vectors = layers.input_vectors(
            len(prepared.inputs), pooled, call.resolved.mix, call.options.normalize, prepared.windows
        )
        return vectors, prepared

    @staticmethod
    def _cut(vectors: np.ndarray, options: EmbedOptions) -> np.ndarray:
        """With ``options.dimensions``, each vector's first components (after the cache, which keeps
        whole vectors); the width: as it is."""
        if options.dimensions is not None and options.dimensions < vectors.shape[1]:
            return layers.first_components(vectors, options.dimensions, options.normalize)
        return vectors
