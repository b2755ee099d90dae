"""The service: what each endpoint means, in terms of the engine's stages.

Validates what the schemas cannot know (limits, the model's layers and length: :mod:`app.options`), takes
admission permits, asks the vector cache (:mod:`app.cache.vectors`) and, for what it lacks, tokenises,
builds work items (windows for long texts: :mod:`app.windows`), awaits the engine and assembles the
answer with the layer arithmetic of :mod:`app.layers`. Knows nothing of HTTP: it raises the typed errors
of :mod:`app.errors` and returns arrays and plain data with their :class:`Timings`; wire encodings and
header names belong to the API layer.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app import dense, entities, fill_mask, layers, token_rows
from app.answers import Answer, Timings, TokenVectors, ms, timed, timings_of
from app.cache import keys as cache_keys
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.postprocess import head_scores
from app.engine.work import Job, Need, Planned, Sequence
from app.errors import EmptyInput, InternalError, NotReady, Unsupported, ValidationFailed
from app.metrics import Metrics
from app.model.manifest import KIND_NAMES, MANIFEST_NAME, Head, Kind
from app.model.runtime import OnnxModel
from app.model.tokenizer import TextInput, TextInputs
from app.options import (
    Direction,
    EmbedAllOptions,
    EmbedOptions,
    LongText,
    Names,
    Resolved,
    check_dimensions,
    listed,
    model_defaults,
    no_tokens,
    prompt_text,
    resolve_embed,
    resolve_embed_all,
    texts_of,
)
from app.settings import Settings
from app.token_ids import token_id_inputs, token_id_lists
from app.windows import (
    TOO_LONG_EMBED,
    TOO_LONG_HEAD,
    TOO_LONG_OPENAI,
    check_length,
    prepare,
    truncate_pair,
    truncated_positions,
)

__all__ = ["Answer", "Service", "Timings", "TokenVectors"]

# Texts embedded at start-up: short, medium and long Chinese inputs, alone and batched.
_WARMUP_TEXTS = ("你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都。" * 12)

# The routes each kind of model serves beside the embedding routes, which every kind serves (a fine-tuned
# head's encoder computes vectors too), and the route a kind's POST / answers as.
HEAD_ROUTES: dict[str, tuple[str, ...]] = {
    "embedding": (),
    "classifier": ("/predict",),
    "reranker": ("/predict", "/rerank"),
    "tagger": ("/token-classification",),
}
EMBEDDING_ROUTES = ("/", "/embed", "/embed_all", "/similarity", "/v1/embeddings", "/tokenize")


@dataclass
class _Computed:
    """What the engine computed for one request (cache misses only)."""

    jobs: list[Job] = field(default_factory=list)
    tokenization_ms: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)  # text → tokens, [CLS] and [SEP] included


class Service:
    def __init__(
        self,
        settings: Settings,
        model: OnnxModel,
        engine: Engine,
        cache: VectorCache,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.model = model
        self.engine = engine
        self.metrics = metrics
        self.cache = cache
        self.ready = False
        m = model.manifest
        self.served_name = settings.served_model_name or m.source.name()
        # OpenAI's model card has a creation time: when this export was written.
        self.created = int((model.folder / MANIFEST_NAME).stat().st_mtime)
        # The exact graph file and tokenizer that compute the vectors (and the Dense modules after the
        # pooling): part of every cache key.
        self.model_digest = cache_keys.model_digest(
            m.graphs["encoder"][model.variant].sha256,
            m.tokenizer.files.get("tokenizer.json", "") + "".join(sorted(m.extra_files.values())),
        )
        self.kind: Kind = m.kind
        # What a request gets for the options it leaves out: the model's own (its sentence-transformers
        # settings), or a plain BERT's.
        self.defaults = model_defaults(m.defaults)
        self.dense = dense.load(model.folder, m.defaults.dense)
        self.width = dense.width(m.defaults.dense, m.config.hidden_size)
        # Prompt name → its text and the tokens it takes ([CLS] and the prompt's own, not [SEP]: how
        # sentence-transformers counts the positions that include_prompt false leaves out of the pooling).
        prompts = m.defaults.prompts
        encoded = model.tokenizer.encode_batch(list(prompts.values()), offsets=False) if prompts else []
        self.prompt_tokens = {name: len(e.ids) - 1 for name, e in zip(prompts, encoded, strict=True)}
        self.vocabulary = entities.vocabulary(model.tokenizer.backend) if self.kind == "tagger" else None

    # --- endpoints --------------------------------------------------------------------------------

    @timed
    async def embed(self, inputs: str | list[str], options: EmbedOptions) -> Answer[np.ndarray]:
        """One float32 vector per input, in input order: [inputs, width]."""
        names = listed("inputs", inputs)
        vectors, timings, _ = await self._vectors(self._texts(inputs, names), options, names)
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
        self._check_ready()
        token_rows.check_long_text(options)
        names = listed("inputs", inputs)
        texts = self._texts(inputs, names)
        resolved = resolve_embed_all(options, self.model.num_layers)
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts)
            kept, rows = token_rows.plan(encodings, self.model.tokenizer.max_length, options, names)
            width = len(resolved.layers) if resolved.mix.how == "concat" else 1
            token_rows.check_token_bound(sum(len(r) for r in rows), width, self.settings.max_embed_all_tokens)
            need = Need(layers=resolved.layers, tokens=True)
            ids = [np.asarray(enc.ids, dtype=np.int64)[k] for enc, k in zip(encodings, kept, strict=True)]
            job = await self._run(ids, need)
        answer = [
            token_rows.token_vectors(enc, k, r, states, resolved.mix, options)
            for enc, k, r, states in zip(encodings, kept, rows, job.token_states, strict=True)
        ]
        return Answer(answer, timings_of([job], tokenization_ms))

    @timed
    async def embeddings(
        self, inputs: str | list[str] | list[int] | list[list[int]], dimensions: int | None
    ) -> Answer[tuple[np.ndarray, int]]:
        """The OpenAI-compatible call: default options, one vector per input, and the tokens counted.

        ``inputs`` are texts, or token ids run as given, as TEI runs them (:mod:`app.token_ids`).

        Returns:
            The vectors and the inputs' tokens ([CLS] and [SEP] included).

        Raises:
            ValidationFailed: ``dimensions`` other than the model's; an id out of the vocabulary; an input
                over the model's length; over the per-request limits.
            EmptyInput: no inputs, or an empty one.
        """
        check_dimensions(dimensions, self.width)
        if (id_inputs := token_id_lists(inputs)) is not None:
            sequences, names = id_inputs
            given = token_id_inputs(
                sequences,
                names,
                self.settings.max_inputs_per_request,
                self.model.tokenizer.max_length,
                self.model.manifest.config.vocab_size,
            )
            texts = list(given)
            vectors, timings, _ = await self._vectors(texts, self.defaults, names, TOO_LONG_OPENAI, given)
            return Answer((vectors, sum(len(given[t]) for t in texts)), timings)
        names = listed("input", inputs)
        texts = self._texts(cast(str | list[str], inputs), names)
        vectors, timings, tokens = await self._vectors(
            texts, self.defaults, names, TOO_LONG_OPENAI, count_tokens=True
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
        """Cosine of ``source`` with each of ``sentences``, or of each pair."""
        options = replace(options, normalize=True)
        if pairs is not None:
            if not pairs:
                raise EmptyInput("pairs is empty: send at least one pair [a, b]")
            names = Names("pairs", lambda k: f"pairs[{k // 2}][{k % 2}]")
            texts = self._texts([t for pair in pairs for t in pair], names)
        else:
            if source is None or sentences is None:
                raise ValidationFailed("give inputs.source_sentence and inputs.sentences, or pairs")
            if not sentences:
                raise EmptyInput("inputs.sentences is empty: send at least one sentence to compare with")
            names = Names(
                "inputs", lambda k: "inputs.source_sentence" if k == 0 else f"inputs.sentences[{k - 1}]"
            )
            texts = self._texts([source, *sentences], names)
        vectors, timings, _ = await self._vectors(texts, options, names)
        if pairs is not None:
            scores = np.einsum("ij,ij->i", vectors[0::2], vectors[1::2])
        else:
            scores = vectors[1:] @ vectors[0]
        return Answer(scores.astype(float).tolist(), timings)

    @timed
    async def fill_mask(
        self, inputs: str | list[str], top_k: int, targets: list[str] | None = None
    ) -> Answer[list[Any]]:
        """The ``top_k`` predictions for each [MASK], in the shapes of transformers' fill-mask pipeline
        (:func:`app.fill_mask.shaped`: a string's answer alone, a list's one answer per input).

        ``targets``, as the pipeline's: only these tokens compete (a target that is not a vocabulary
        token stands for its first token), scored by their probability over the whole vocabulary.

        Raises:
            Unsupported: the model has no masked-LM head.
            EmptyInput: no inputs, or an empty one.
            ValidationFailed: an input without [MASK] or over the model's length; more than
                ``MAX_MASKS_PER_REQUEST`` masks; a target over ``max_input_chars``; no target left.
        """
        self._check_ready()
        if not self.model.has_mlm_head:
            raise Unsupported("this model has no masked-LM head, so it cannot fill masks")
        names = listed("inputs", inputs)
        texts = self._texts(inputs, names)
        fill_mask.check_targets(targets, self.settings.max_input_chars)
        mask_id = self.model.manifest.tokenizer.mask_id
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts, offsets=False)
            sequences, positions = fill_mask.masked(
                encodings, mask_id, self.model.tokenizer.max_length, names
            )
            needs = [Need(mask_positions=p) for p in positions]
            candidates = None
            if targets is not None:
                candidates, target_ms = await self._target_ids(targets)
                tokenization_ms += target_ms
            job = await self._run(sequences, needs)
        answer = fill_mask.answers(
            self.model.tokenizer, sequences, positions, job.mask_probs, top_k, candidates
        )
        return Answer(
            fill_mask.shaped(answer, one_text=isinstance(inputs, str)), timings_of([job], tokenization_ms)
        )

    @timed
    async def tokenize(self, inputs: str | list[str], add_special_tokens: bool) -> Answer[list[Any]]:
        """Tokens with ids, text and character offsets, per input."""
        self._check_ready()
        texts = self._texts(inputs, listed("inputs", inputs))
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts, add_special_tokens)
        return Answer(token_rows.token_table(encodings), Timings(tokenization_ms=tokenization_ms))

    @timed
    async def predict(
        self, inputs: list[TextInput], raw_scores: bool, long_text: LongText, direction: Direction
    ) -> Answer[list[list[dict[str, Any]]]]:
        """Per input (a text or a pair), every label with its score, best first: softmax (or sigmoid
        for one label or multi-label) of the head's logits, or the logits with ``raw_scores``, as
        transformers' ``pipeline("text-classification", top_k=None)`` answers.

        Raises:
            Unsupported: the model has no sequence head.
            ValidationFailed: an input over the model's length without truncation.
        """
        head = self._head("/predict", "classifier", "reranker")
        # A pair's texts are both named as its input, inputs[i]; the count is of inputs, not of texts.
        self._texts([x if isinstance(x, str) else x[0] for x in inputs], listed("inputs", inputs))
        owners = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
        if owners:
            self._texts([inputs[i][1] for i in owners], Names("inputs", lambda k: f"inputs[{owners[k]}]"))
        logits, timings = await self._head_logits(inputs, long_text, direction)
        scores = logits if raw_scores else head_scores(logits, head.activation)
        labels = head.labels
        answer = []
        for row in scores:
            order = np.argsort(-row, kind="stable")
            answer.append(
                [{"score": float(row[k]), "label": labels.get(int(k), f"LABEL_{k}")} for k in order]
            )
        return Answer(answer, timings)

    @timed
    async def rerank(
        self,
        query: str,
        texts: list[str],
        raw_scores: bool,
        return_text: bool,
        long_text: LongText,
        direction: Direction,
    ) -> Answer[list[dict[str, Any]]]:
        """Each text's relevance to ``query``, best first (``index`` is its position in ``texts``): the
        cross-encoder's score of the pair (query, text), as sentence-transformers' ``CrossEncoder.predict``.

        Raises:
            Unsupported: the model is not a cross-encoder (one label).
            EmptyInput: no texts, or an empty query or text.
        """
        head = self._head("/rerank", "reranker")
        if not texts:
            raise EmptyInput("texts is empty: send at least one text to rank")
        self._texts([query], Names("query", lambda _i: "query"))
        self._texts(texts, listed("texts", texts))
        logits, timings = await self._head_logits([(query, t) for t in texts], long_text, direction, "texts")
        scores = (logits if raw_scores else head_scores(logits, head.activation))[:, 0]
        order = np.argsort(-scores, kind="stable")
        ranks = []
        for k in order.tolist():
            rank: dict[str, Any] = {"index": k, "score": float(scores[k])}
            if return_text:
                rank["text"] = texts[k]
            ranks.append(rank)
        return Answer(ranks, timings)

    @timed
    async def token_classification(
        self,
        inputs: str | list[str],
        strategy: entities.AggregationStrategy,
        ignore_labels: list[str],
        long_text: LongText,
        direction: Direction,
    ) -> Answer[list[Any]]:
        """The entities of each input, as transformers' ``pipeline("token-classification")`` with
        ``aggregation_strategy`` answers (:mod:`app.entities`); a string's answer alone, a list's one
        answer per input.

        Raises:
            Unsupported: the model is not a token classifier.
            ValidationFailed: an input over the model's length without truncation; an unknown strategy.
        """
        head = self._head("/token-classification", "tagger")
        names = listed("inputs", inputs)
        texts = self._texts(inputs, names)
        limit = self.model.tokenizer.max_length
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts)
            kept = []
            for i, enc in enumerate(encodings):
                if len(enc.ids) <= 2:
                    raise no_tokens(names.item(i))
                if len(enc.ids) > limit and long_text == "error":
                    check_length(names.item(i), len(enc.ids), limit, TOO_LONG_HEAD)
                kept.append(
                    truncated_positions(len(enc.ids), limit, direction)
                    if len(enc.ids) > limit
                    else np.arange(len(enc.ids))
                )
            ids = [np.asarray(e.ids, dtype=np.int64)[k] for e, k in zip(encodings, kept, strict=True)]
            job = await self._run(ids, Need(head=True))
        answer = []
        for text, enc, k, states in zip(texts, encodings, kept, job.token_states, strict=True):
            if states is None:
                raise InternalError("a tagger job came back without its token logits")
            offsets, special = enc.offsets, enc.special_tokens_mask
            answer.append(
                entities.entities(
                    text,
                    [enc.ids[j] for j in k],
                    [offsets[j] for j in k],
                    [special[j] for j in k],
                    head_scores(states[0], "softmax").astype(np.float32),
                    head.labels,
                    cast(entities.Vocabulary, self.vocabulary),
                    strategy,
                    ignore_labels,
                )
            )
        value: list[Any] = answer[0] if isinstance(inputs, str) else answer
        return Answer(value, timings_of([job], tokenization_ms))

    def routes(self) -> list[str]:
        """The data routes this model serves (the embedding routes, fill-mask with an MLM head, and its
        head's routes)."""
        return [
            *EMBEDDING_ROUTES,
            *(("/fill-mask",) if self.model.has_mlm_head else ()),
            *HEAD_ROUTES[self.kind],
        ]

    def _head(self, route: str, *kinds: str) -> Head:
        """The model's head, if it is of one of ``kinds``.

        Raises:
            Unsupported: it is not (the message names the model's kind and what it serves).
        """
        self._check_ready()
        head = self.model.manifest.head
        if self.kind not in kinds or head is None or not self.model.has_head:
            wanted = " or ".join(KIND_NAMES[k] for k in kinds)
            raise Unsupported(
                f"{route} needs {wanted}; this model ({self.served_name}) is {KIND_NAMES[self.kind]}, "
                f"which serves {', '.join(self.routes())}"
            )
        return head

    async def _head_logits(
        self,
        inputs: list[TextInput],
        long_text: LongText,
        direction: Direction,
        field_name: str = "inputs",
    ) -> tuple[np.ndarray, Timings]:
        """The head's logits [inputs, labels] of texts and pairs (checked by the caller against the
        per-request limits), through the cache when there is one; ``field_name`` names them in errors."""
        # Each input's cache key is its JSON: a text's a JSON string, a pair's a JSON array, never the same.
        keys = [json.dumps(x, ensure_ascii=False) for x in inputs]
        item = dict(zip(keys, inputs, strict=True))
        position = {k: i for i, k in reversed(list(enumerate(keys)))}  # a key's first input, for messages
        limit = self.model.tokenizer.max_length
        jobs: list[Job] = []
        tokenization_ms = 0.0

        async def compute(todo: list[str]) -> np.ndarray:
            nonlocal tokenization_ms
            todo_inputs = [item[k] for k in todo]
            encodings, took = await self._tokenize(todo_inputs, offsets=False)
            tokenization_ms += took
            ids, types = [], []
            for k, (x, enc) in enumerate(zip(todo_inputs, encodings, strict=True)):
                name = f"{field_name}[{position[todo[k]]}]"
                row = np.asarray(enc.ids, dtype=np.int64)
                kinds = np.asarray(enc.type_ids, dtype=np.int64)
                if len(row) > limit:
                    if long_text == "error":
                        check_length(name, len(row), limit, TOO_LONG_HEAD)
                    if isinstance(x, str):
                        keep = truncated_positions(len(row), limit, direction)
                        row, kinds = row[keep], kinds[keep]
                    else:
                        row, kinds = truncate_pair(row, kinds, limit, direction)
                ids.append(row)
                types.append(kinds if not isinstance(x, str) else None)
            job = Job(asyncio.get_running_loop(), len(ids))
            enqueued = time.perf_counter()
            need = Need(head=True)
            work = [
                Sequence(x, need, job, i, enqueued, t)
                for i, (x, t) in enumerate(zip(ids, types, strict=True))
            ]
            await self.engine.run(job, work)
            jobs.append(job)
            if job.vectors is None:
                raise InternalError("a /predict job came back without its logits")
            return job.vectors[:, 0, :]

        with self.engine.admit(len(inputs)):
            if self.cache.enabled:
                prefix = cache_keys.space(
                    self.model_digest,
                    {
                        **dict.fromkeys(("pooling", "layers", "layer_combine", "layer_weights", "normalize")),
                        "long_text": long_text,
                        "truncation_direction": direction,
                        "input": "json",  # keys are each text or pair as JSON
                        "prompt": None,
                        "output": "head_logits",
                    },
                )
                logits = np.stack(await self.cache.vectors(prefix, keys, compute))
            else:
                distinct = list(dict.fromkeys(keys))
                row_of = {k: i for i, k in enumerate(distinct)}
                logits = (await compute(distinct))[[row_of[k] for k in keys]]
        return logits, timings_of(jobs, tokenization_ms)

    async def warmup(self) -> None:
        """Embed and fill a few inputs of typical shapes so the first real request pays no set-up (the app
        marks the service ready once this is done: :mod:`app.main`)."""
        texts = list(_WARMUP_TEXTS)
        # No more at once than the server admits (a warm-up refused with 429 would never mark it ready).
        room = self.settings.max_concurrent_inputs
        for batch in ([texts[0]], texts[:room], (texts * 3)[:room]):
            await self._vectors(
                batch,
                replace(self.defaults, long_text="truncate"),
                listed("inputs", batch),
                check_ready=False,
                use_cache=False,
            )
        if self.model.has_mlm_head:
            ids = np.array(
                [
                    self.model.manifest.tokenizer.cls_id,
                    self.model.manifest.tokenizer.mask_id,
                    self.model.manifest.tokenizer.sep_id,
                ],
                dtype=np.int64,
            )
            await self._run([ids], [Need(mask_positions=(1,))])

    # --- shared steps -----------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if not self.ready:
            raise NotReady("the model is still warming up")

    def _texts(self, inputs: str | list[str], names: Names) -> list[str]:
        return texts_of(inputs, self.settings.max_inputs_per_request, self.settings.max_input_chars, names)

    async def _tokenize(
        self, texts: TextInputs, add_special_tokens: bool = True, offsets: bool = True
    ) -> tuple[list[TokenEncoding], float]:
        """Encodings of ``texts`` and the milliseconds it took; ``offsets=False`` when no span is read."""
        started = time.perf_counter()
        encodings = await self.engine.tokenize(texts, add_special_tokens, offsets)
        seconds = time.perf_counter() - started
        self.metrics.tokenized(seconds)
        return encodings, ms(seconds)

    async def _target_ids(self, targets: list[str]) -> tuple[np.ndarray, float]:
        """The token ids fill-mask ``targets`` stand for (:func:`app.fill_mask.target_ids`), and the
        milliseconds spent tokenising those that are not vocabulary tokens (none when all are).
        """
        known, unknown = fill_mask.split_targets(self.model.tokenizer, targets)
        tokenized: list[list[int]] = []
        tokenization_ms = 0.0
        if unknown:
            encodings, tokenization_ms = await self._tokenize(
                unknown, add_special_tokens=False, offsets=False
            )
            tokenized = [e.ids for e in encodings]
        return fill_mask.target_ids(known, tokenized), tokenization_ms

    async def _run(self, sequences: list[np.ndarray], need: Need | list[Need]) -> Job:
        """Run ``sequences`` (token ids) as one job, each with ``need`` (or its own); the job's results."""
        job = Job(asyncio.get_running_loop(), len(sequences))
        needs = need if isinstance(need, list) else [need] * len(sequences)
        enqueued = time.perf_counter()
        work = [
            Sequence(ids, n, job, i, enqueued)
            for i, (ids, n) in enumerate(zip(sequences, needs, strict=True))
        ]
        return await self.engine.run(job, work)

    async def _vectors(
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
        the cache when there is one.

        ``names`` name the texts in error messages, ``too_long`` says what to do about one over the
        model's length. With ``given``, the texts are keys of token ids that run as they are.

        Returns:
            The vectors, the timings of what was computed, and (with ``count_tokens``) each text's tokens.
        """
        if check_ready:
            self._check_ready()
        resolved = resolve_embed(options, self.model.num_layers, self.model.has_pooler)
        pool_from = 0
        asked = texts
        if given is None and (
            prompt := prompt_text(options.prompt_name, self.model.manifest.defaults.prompts)
        ):
            texts = [prompt + t for t in texts]
            if not self.model.manifest.defaults.include_prompt:
                pool_from = self.prompt_tokens[cast(str, options.prompt_name)]
                if options.long_text == "chunk":
                    raise ValidationFailed(
                        "long_text 'chunk' cannot go with this model's prompts: its pooling leaves the prompt "
                        "out, and only the first window holds it; use long_text 'truncate'"
                    )
        need = Need(layers=resolved.layers, pooling=options.pooling, pool_from=pool_from)
        first = {text: i for i, text in reversed(list(enumerate(texts)))}
        computed = _Computed()
        info = self.model.manifest.tokenizer
        limit = self.model.tokenizer.max_length

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
                job = await self._run(work.ids, need)
                context = work.context
            else:

                def plan(encodings: list[TokenEncoding]) -> Planned:  # on the tokenisation thread
                    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
                    if empty := [k for k, x in enumerate(ids) if len(x) <= 2]:
                        raise no_tokens(names.item(first[todo[empty[0]]]))
                    return planned(todo, ids)

                job = await self.engine.run_texts(todo, plan)
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
        with self.engine.admit(len(texts)):
            if use_cache and self.cache.enabled:
                prefix = self._key_prefix(options, resolved, token_ids=given is not None)
                vectors = np.stack(await self.cache.vectors(prefix, texts, compute))
            elif len(first) < len(texts):  # repeated texts: each computed once
                distinct = list(dict.fromkeys(texts))
                row = {t: i for i, t in enumerate(distinct)}
                vectors = (await compute(distinct))[[row[t] for t in texts]]
            else:  # no cache: no keys, no flights, nothing per text beyond the work itself
                vectors = await compute(texts)
            if count_tokens and (uncounted := [t for t in first if t not in computed.tokens]):
                encodings, _ = await self._tokenize(uncounted, offsets=False)
                computed.tokens.update((t, len(e.ids)) for t, e in zip(uncounted, encodings, strict=True))
        tokens = computed.tokens
        if count_tokens and texts is not asked:  # counted with the prompt, reported by the texts sent
            tokens = {a: tokens[t] for a, t in zip(asked, texts, strict=True)}
        return vectors, timings_of(computed.jobs, computed.tokenization_ms), tokens

    def _key_prefix(self, options: EmbedOptions, resolved: Resolved, token_ids: bool = False) -> str:
        """Everything besides the text that changes a vector: model, pooling, layers and the rest; and
        whether the "texts" are token ids written out (their own key space: ids "101,102" are not the
        text "101,102")."""
        return cache_keys.space(
            self.model_digest,
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
