"""Embeddings: a vector per input (``/embed``, ``POST /``, OpenAI's ``/v1/embeddings``) and their cosines
(``/similarity``). The cache keeps whole vectors with their inputs' tokens; ``dimensions`` cuts them to
their first components after it (Matryoshka)."""

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
from app.tasks.core import Core, Packing, Task
from app.tasks.options import (
    EmbedOptions,
    Names,
    Resolved,
    check_dimensions,
    check_prompt_fits,
    listed,
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
    """A call's vectors (cut to ``dimensions``), their inputs' tokens, and what ``rows`` left out."""

    vectors: np.ndarray
    tokens: np.ndarray
    timings: Timings
    problems: dict[int, ServiceError] = field(default_factory=dict)


def _unpack(stored: list[np.ndarray]) -> _Pair:
    rows = np.stack(stored)
    return np.ascontiguousarray(rows[:, :-1]), rows[:, -1].astype(np.int64)


_CALLS = 256  # distinct options resolved and kept (a full map starts again)


@dataclass(frozen=True)
class _Call:
    """A call's options resolved against the model once."""

    options: EmbedOptions
    resolved: Resolved
    need: Need
    rules: Rules
    prompt: str  # put before each text; "" for none (and for token ids)
    width: int  # of the whole vectors (layers side by side widen them)
    # Each cache entry is the whole vector and its input's tokens, so that a hit is counted without
    # tokenising it again (exact in float32 below 2**24).
    packing: Packing[_Pair, _Pair]


class Embeddings(Task):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        m = core.model.manifest
        self.dense = dense.load(core.model.folder, m.defaults.dense)
        # The width of the vectors: the encoder's hidden size, or the last Dense module's output.
        self.width = dense.width(m.defaults.dense, m.config.hidden_size)
        # Prompt name → its tokens ([CLS] and the prompt's own, not [SEP]: how sentence-transformers counts
        # the positions that include_prompt false leaves out of the pooling).
        prompts = m.defaults.prompts
        encoded = core.model.tokenizer.encode_batch(list(prompts.values()), offsets=False) if prompts else []
        self.prompt_tokens = {name: len(e.ids) - 1 for name, e in zip(prompts, encoded, strict=True)}
        self._calls: dict[tuple[EmbedOptions, str, bool], _Call] = {}

    @timed
    async def embed(self, inputs: str | list[str], options: EmbedOptions) -> Answer[np.ndarray]:
        """One float32 vector per input, in input order: [inputs, width]."""
        names = listed("inputs", inputs)
        got = await self.vectors(self.core.texts(inputs, names), options, names)
        return Answer(got.vectors, got.timings)

    @timed
    async def openai(
        self, inputs: str | list[str] | list[int] | list[list[int]], dimensions: int | None
    ) -> Answer[tuple[np.ndarray, int]]:
        """OpenAI's embeddings (of texts, or token ids run as given): the vectors and their tokens."""
        options = replace(self.core.defaults, dimensions=dimensions)
        todo: list[str] | GivenIds
        if (id_inputs := token_id_lists(inputs)) is not None:
            sequences, names = id_inputs
            most = self.core.settings.max_inputs_per_request
            vocab = self.core.model.manifest.config.vocab_size
            todo, problems = given_ids(sequences, self.core.rules(TOO_LONG_OPENAI), names, most, vocab)
            if problems:
                raise problems[min(problems)]
        else:
            names = listed("input", inputs)
            todo = self.core.texts(cast(str | list[str], inputs), names)
        got = await self.vectors(todo, options, names, TOO_LONG_OPENAI)
        return Answer((got.vectors, int(got.tokens.sum())), got.timings)

    @timed
    async def similarity(
        self,
        source: str | None,
        sentences: list[str] | None,
        pairs: list[list[str]] | None,
        options: EmbedOptions,
    ) -> Answer[list[float]]:
        """Cosine of ``source`` with each of ``sentences``, or of each pair."""
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
        got = await self.vectors(texts, options, names)
        v = got.vectors
        scores = np.einsum("ij,ij->i", v[0::2], v[1::2]) if pairs is not None else v[1:] @ v[0]
        return Answer(scores.astype(float).tolist(), got.timings)

    async def vectors(
        self,
        inputs: list[str] | GivenIds,
        options: EmbedOptions,
        names: Names,
        too_long: str = TOO_LONG_EMBED,
    ) -> Vectors:
        """Each input's vector (texts with the model's prompt, or token ids run as given), through the cache
        when there is one: a request's call (ready or refused), which its first bad input refuses."""
        self.core.check_ready()
        token_ids = isinstance(inputs, GivenIds)
        call = self._call(options, too_long, token_ids)
        if isinstance(inputs, GivenIds):
            keys = inputs.keys
            ids_of = dict(zip(keys, inputs.ids, strict=True))
        else:
            keys = [call.prompt + t for t in inputs] if call.prompt else inputs
        spent = Spent()

        async def compute(todo: list[str], first: Callable[[int], int]) -> tuple[np.ndarray, np.ndarray]:
            runs: list[str] | list[np.ndarray] = [ids_of[k] for k in todo] if token_ids else todo
            vectors, prepared = await self._compute(call, runs, lambda i: names.item(first(i)), spent)
            return vectors, prepared.tokens

        vectors, tokens = await self.core.cached(keys, compute, call.packing)
        return Vectors(self._cut(vectors, options), tokens, spent.timings())

    async def rows(self, texts: list[str], options: EmbedOptions, names: Names, too_long: str) -> Vectors:
        """Each text's vector, or why it is refused, in a request's words: the bulk job's call (and the
        warm-up's). Nothing is cached; one engine call, whatever is wrong."""
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
        return Vectors(self._cut(vectors[at], options), prepared.tokens[at], spent.timings(), problems)

    def _call(self, options: EmbedOptions, too_long: str, token_ids: bool) -> _Call:
        """``options`` resolved once per distinct options: it costs more than a one-text request's work."""
        key = (options, too_long, token_ids)
        if (call := self._calls.get(key)) is not None:
            return call
        resolved = resolve_embed(options, self.core.model.num_layers, self.core.model.has_pooler)
        width = self.width * len(resolved.layers) if resolved.mix.how == "concat" else self.width
        check_dimensions(options.dimensions, width, self.core.model.manifest.defaults)
        # Token ids run as given: [CLS] [SEP] alone is the sender's to send.
        rules = self.core.rules(too_long, options.long_text, options.truncation_direction, not token_ids)
        pool_from = 0
        prompts = self.core.model.manifest.defaults.prompts
        prompt = "" if token_ids else prompt_text(options.prompt_name, prompts) or ""
        if prompt:
            # [CLS] and the prompt: truncation keeps them whichever end it cuts, as encode keeps a prompt.
            name = cast(str, options.prompt_name)
            keep = self.prompt_tokens[name]
            check_prompt_fits(name, keep, rules.limit)
            rules = replace(rules, keep=keep)
            if not self.core.model.manifest.defaults.include_prompt:
                pool_from = keep
                if options.long_text == "chunk":
                    raise ValidationFailed(
                        "long_text 'chunk' cannot go with this model's prompts: its pooling leaves the prompt "
                        "out, and only the first window holds it; use long_text 'truncate'"
                    )
        space = self.core.key_space(**vector_key(options, resolved, token_ids))
        packing: Packing[_Pair, _Pair] = Packing(
            lambda: space,
            width + 1,
            lambda got: np.column_stack([got[0], got[1].astype(np.float32)]),
            _unpack,
            lambda got, at: got if at is None else (got[0][at], got[1][at]),
        )
        need = Need(layers=resolved.layers, pooling=options.pooling, pool_from=pool_from)
        if len(self._calls) >= _CALLS:
            self._calls.clear()
        call = self._calls[key] = _Call(options, resolved, need, rules, prompt, width, packing)
        return call

    async def _compute(
        self, call: _Call, inputs: list[str] | list[np.ndarray], name: Name, spent: Spent, refuse: bool = True
    ) -> tuple[np.ndarray, Prepared]:
        """One engine call: the vectors of the good inputs (texts, prepared on the tokenisation thread; or
        token ids) and how they were prepared. ``refuse``: the first bad input fails the call."""

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
        """With ``options.dimensions``, each vector's first components (the cache keeps whole vectors)."""
        if options.dimensions is not None and options.dimensions < vectors.shape[1]:
            return layers.first_components(vectors, options.dimensions, options.normalize)
        return vectors
