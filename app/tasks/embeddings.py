"""Embeddings and similarity: a vector per input (``/embed``, ``POST /``, OpenAI's ``/v1/embeddings``),
cosines of those vectors (``/similarity``), and the vector of each token (``/embed_all``).

The way every vector is made: the texts (with the model's prompt), through the vector cache when there
is one (:mod:`app.cache.vectors`), what it lacks tokenised and planned into sequences on the tokenisation
thread (windows for long texts: :mod:`app.tasks.windows`), pooled by the engine, through the model's
Dense modules (:mod:`app.model.dense`), then combined across layers and windows and normalised
(:mod:`app.tasks.layers`); and last, with ``dimensions``, cut to their first components and normalised
again (Matryoshka), after the cache, which keeps whole vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app.cache import keys as cache_keys
from app.engine.work import Job, Need, Planned
from app.errors import EmptyInput, InternalError, ValidationFailed
from app.model import dense
from app.tasks import layers, token_rows
from app.tasks.answers import Answer, TokenVectors, timed, timings_of
from app.tasks.core import Core
from app.tasks.options import (
    EmbedAllOptions,
    EmbedOptions,
    Names,
    Resolved,
    check_dimensions,
    listed,
    matryoshka_of,
    no_tokens,
    prompt_text,
    resolve_embed,
    resolve_embed_all,
)
from app.tasks.token_ids import token_id_inputs, token_id_lists
from app.tasks.windows import TOO_LONG_EMBED, TOO_LONG_OPENAI, prepare
from app.telemetry.timings import Timings, ms


@dataclass
class _Computed:
    """What the engine computed for one request (cache misses only)."""

    jobs: list[Job] = field(default_factory=list)
    tokenization_ms: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)  # text → tokens, [CLS] and [SEP] included


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

    @timed
    async def embed(self, inputs: str | list[str], options: EmbedOptions) -> Answer[np.ndarray]:
        """One float32 vector per input, in input order: [inputs, width]."""
        names = listed("inputs", inputs)
        vectors, timings, _ = await self.vectors(self.core.texts(inputs, names), options, names)
        return Answer(vectors, timings)

    @timed
    async def embed_all(
        self, inputs: str | list[str], options: EmbedAllOptions
    ) -> Answer[list[TokenVectors]]:
        """Per input, the vector of each of its tokens, in order; never a padding position.

        A token's vector is its layers' states combined by ``layer_combine``, then (``normalize``)
        scaled to unit length; ``norms`` are taken before that. Spans index the original text in
        characters (code points, like Python's ``str``). Not cached: one input's token matrix weighs as
        much as a hundred sentence vectors in the byte-bounded cache and is rarely asked for twice.

        Returns:
            Per input its token vectors, and the tokens and norms if asked for.

        Raises:
            ValidationFailed: long_text "chunk"; an input over the model's length with long_text
                "error"; more tokens than ``max_embed_all_tokens``; layers or weights that do not fit.
        """
        self.core.check_ready()
        token_rows.check_long_text(options)
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        resolved = resolve_embed_all(options, self.core.model.num_layers)
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.tokenize(texts)
            kept, rows = token_rows.plan(encodings, self.core.model.tokenizer.max_length, options, names)
            width = len(resolved.layers) if resolved.mix.how == "concat" else 1
            token_rows.check_token_bound(
                sum(len(r) for r in rows), width, self.core.settings.max_embed_all_tokens
            )
            need = Need(layers=resolved.layers, tokens=True)
            ids = [np.asarray(enc.ids, dtype=np.int64)[k] for enc, k in zip(encodings, kept, strict=True)]
            job = await self.core.run(ids, need)
        answer = [
            token_rows.token_vectors(enc, k, r, states, resolved.mix, options)
            for enc, k, r, states in zip(encodings, kept, rows, job.token_states, strict=True)
        ]
        return Answer(answer, timings_of([job], tokenization_ms))

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
            given = token_id_inputs(
                sequences,
                names,
                self.core.settings.max_inputs_per_request,
                self.core.model.tokenizer.max_length,
                self.core.model.manifest.config.vocab_size,
            )
            texts = list(given)
            vectors, timings, _ = await self.vectors(texts, options, names, TOO_LONG_OPENAI, given)
            return Answer((vectors, sum(len(given[t]) for t in texts)), timings)
        names = listed("input", inputs)
        texts = self.core.texts(cast(str | list[str], inputs), names)
        vectors, timings, tokens = await self.vectors(
            texts, options, names, TOO_LONG_OPENAI, count_tokens=True
        )
        return Answer((vectors, sum(tokens[t] for t in texts)), timings)

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
            if not pairs:
                raise EmptyInput("pairs is empty: send at least one pair [a, b]")
            names = Names("pairs", lambda k: f"pairs[{k // 2}][{k % 2}]")
            texts = self.core.texts([t for pair in pairs for t in pair], names)
        else:
            if source is None or sentences is None:
                raise ValidationFailed("give inputs.source_sentence and inputs.sentences, or pairs")
            if not sentences:
                raise EmptyInput("inputs.sentences is empty: send at least one sentence to compare with")
            names = Names(
                "inputs", lambda k: "inputs.source_sentence" if k == 0 else f"inputs.sentences[{k - 1}]"
            )
            texts = self.core.texts([source, *sentences], names)
        vectors, timings, _ = await self.vectors(texts, options, names)
        if pairs is not None:
            scores = np.einsum("ij,ij->i", vectors[0::2], vectors[1::2])
        else:
            scores = vectors[1:] @ vectors[0]
        return Answer(scores.astype(float).tolist(), timings)

    async def vectors(
        self,
        texts: list[str],
        options: EmbedOptions,
        names: Names,
        too_long: str = TOO_LONG_EMBED,
        given: dict[str, np.ndarray] | None = None,
        check_ready: bool = True,
        use_cache: bool = True,
        count_tokens: bool = False,
    ) -> tuple[np.ndarray, Timings, dict[str, int]]:
        """The combined (and optionally normalised) float32 vector of each text, [texts, width], through
        the cache when there is one; with ``options.dimensions``, its first components [texts, dimensions]
        (normalised again if ``options.normalize``).

        ``names`` name the texts in error messages, ``too_long`` says what to do about one over the
        model's length. With ``given``, the texts are keys of token ids that run as they are.

        Returns:
            The vectors, the timings of what was computed, and (with ``count_tokens``) each text's tokens.
        """
        if check_ready:
            self.core.check_ready()
        resolved = resolve_embed(options, self.core.model.num_layers, self.core.model.has_pooler)
        self._check_dimensions(options, resolved)
        pool_from = 0
        asked = texts
        if given is None and (
            prompt := prompt_text(options.prompt_name, self.core.model.manifest.defaults.prompts)
        ):
            texts = [prompt + t for t in texts]
            if not self.core.model.manifest.defaults.include_prompt:
                pool_from = self.prompt_tokens[cast(str, options.prompt_name)]
                if options.long_text == "chunk":
                    raise ValidationFailed(
                        "long_text 'chunk' cannot go with this model's prompts: its pooling leaves the prompt "
                        "out, and only the first window holds it; use long_text 'truncate'"
                    )
        need = Need(layers=resolved.layers, pooling=options.pooling, pool_from=pool_from)
        first = {text: i for i, text in reversed(list(enumerate(texts)))}
        computed = _Computed()
        info = self.core.model.manifest.tokenizer
        limit = self.core.model.tokenizer.max_length

        def planned(todo: list[str], ids: list[np.ndarray]) -> Planned:
            prepared = prepare(
                ids,
                options,
                limit,
                (info.cls_id, info.sep_id),
                lambda i: names.item(first[todo[i]]),
                too_long,
            )
            lengths = [len(x) for x in ids] if count_tokens else None
            return Planned(prepared.sequences, need, (prepared.windows, lengths))

        async def compute(todo: list[str]) -> np.ndarray:
            if given is not None:
                work = planned(todo, [given[t] for t in todo])
                job = await self.core.run(work.ids, need)
                context = work.context
            else:

                def plan(encodings: list[TokenEncoding]) -> Planned:  # on the tokenisation thread
                    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
                    if empty := [k for k, x in enumerate(ids) if len(x) <= 2]:
                        raise no_tokens(names.item(first[todo[empty[0]]]))
                    return planned(todo, ids)

                job = await self.core.engine.run_texts(todo, plan)
                computed.tokenization_ms += ms(job.tokenized_s)
                context = job.context
            windows, lengths = context
            if lengths is not None:
                computed.tokens.update(zip(todo, lengths, strict=True))
            computed.jobs.append(job)
            if job.vectors is None:
                raise InternalError("an /embed job came back without its pooled vectors")
            pooled = dense.apply(job.vectors, self.dense) if self.dense else job.vectors
            return layers.input_vectors(len(todo), pooled, resolved.mix, options.normalize, windows)

        # Permits cover every input, cached or not: they bound the in-flight map and the queues behind it.
        with self.core.engine.admit(len(texts)):
            if use_cache and self.core.cache.enabled:
                prefix = self._key_prefix(options, resolved, token_ids=given is not None)
                vectors = np.stack(await self.core.cache.vectors(prefix, texts, compute))
            elif len(first) < len(texts):  # repeated texts: each computed once
                distinct = list(dict.fromkeys(texts))
                row = {t: i for i, t in enumerate(distinct)}
                vectors = (await compute(distinct))[[row[t] for t in texts]]
            else:  # no cache: no keys, no flights, nothing per text beyond the work itself
                vectors = await compute(texts)
            if count_tokens and (uncounted := [t for t in first if t not in computed.tokens]):
                encodings, _ = await self.core.tokenize(uncounted, offsets=False)
                computed.tokens.update((t, len(e.ids)) for t, e in zip(uncounted, encodings, strict=True))
        if options.dimensions is not None and options.dimensions < vectors.shape[1]:  # the width: as it is
            vectors = layers.first_components(vectors, options.dimensions, options.normalize)
        tokens = computed.tokens
        if count_tokens and texts is not asked:  # counted with the prompt, reported by the texts sent
            tokens = {a: tokens[t] for a, t in zip(asked, texts, strict=True)}
        return vectors, timings_of(computed.jobs, computed.tokenization_ms), tokens

    def _check_dimensions(self, options: EmbedOptions, resolved: Resolved) -> None:
        """``options.dimensions`` against the width of the vectors asked for (layers side by side widen them)."""
        width = self.width * len(resolved.layers) if resolved.mix.how == "concat" else self.width
        check_dimensions(options.dimensions, width, self.matryoshka)

    def _key_prefix(self, options: EmbedOptions, resolved: Resolved, token_ids: bool = False) -> str:
        """Everything besides the text that changes a vector: model, pooling, layers and the rest; and
        whether the "texts" are token ids written out (their own key space: ids "101,102" are not the
        text "101,102"). Not ``dimensions``: the cache keeps whole vectors, cut after it (normalising a cut
        of a normalised vector gives what normalising the cut of the raw one does)."""
        return cache_keys.space(
            self.core.model_digest,
            {
                "pooling": options.pooling,
                "layers": list(resolved.layers),  # resolved: -1 and L are the same vector
                "layer_combine": options.layer_combine,
                # scaled to sum 1
                "layer_weights": list(resolved.mix.weights) if resolved.mix.weights is not None else None,
                "normalize": options.normalize,
                "long_text": options.long_text,
                "truncation_direction": options.truncation_direction,
                "input": "token_ids" if token_ids else "text",
                # The texts carry the prompt; its name keys whether it was pooled (include_prompt).
                "prompt": options.prompt_name if not token_ids else None,
                "output": "vector",
            },
        )
