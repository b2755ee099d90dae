"""The service: what each endpoint means, in terms of the engine's stages.

Validates what the schemas cannot know (limits, the model's layers and length), takes admission
permits, asks the vector cache (:mod:`app.cache.vectors`) and, for what it lacks, tokenises, builds work
items (windows for long texts), awaits the engine and assembles the answer with the post-processing
functions. Knows nothing of HTTP: it raises the typed errors of
:mod:`app.errors` and returns plain data plus :class:`Timings`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app import __version__
from app.cache import keys as cache_keys
from app.cache.vectors import VectorCache
from app.engine import postprocess
from app.engine.engine import Engine
from app.engine.work import ItemResult, Need, Pooling, Ticket, WorkItem
from app.errors import EmptyInput, NotReady, Unsupported, ValidationFailed
from app.metrics import Metrics
from app.model.runtime import OnnxModel
from app.settings import Settings

LongText = Literal["error", "truncate", "chunk"]
Direction = Literal["right", "left"]

# Texts embedded at start-up: short, medium and long Chinese inputs, alone and batched.
_WARMUP_TEXTS = ("你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都。" * 12)


@dataclass
class Timings:
    """Milliseconds a request spent in each stage; sent as the ``x-*-time`` headers."""

    queue_ms: float = 0.0
    tokenization_ms: float = 0.0
    inference_ms: float = 0.0
    total_ms: float = 0.0

    def headers(self) -> dict[str, str]:
        return {
            "x-queue-time": f"{self.queue_ms:.3f}",
            "x-tokenization-time": f"{self.tokenization_ms:.3f}",
            "x-inference-time": f"{self.inference_ms:.3f}",
            "x-total-time": f"{self.total_ms:.3f}",
        }


@dataclass(frozen=True)
class EmbedOptions:
    pooling: Pooling = "mean"
    layers: tuple[int, ...] | None = None  # as requested: 1-based, negatives from the end; None = last
    layer_combine: postprocess.LayerCombine = "concat"
    long_text: LongText = "error"
    truncation_direction: Direction = "right"
    normalize: bool = True


@dataclass
class _Prepared:
    items: list[WorkItem]
    owner: list[int]  # item index → input index
    weights: list[int]  # item index → tokens it carries (for averaging windows)


@dataclass
class _Computed:
    """What the engine computed for one request (cache misses only)."""

    results: list[ItemResult] = field(default_factory=list)
    tokenization_ms: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)  # text → tokens, [CLS] and [SEP] included


class Service:
    def __init__(
        self,
        settings: Settings,
        model: OnnxModel,
        engine: Engine,
        cache: VectorCache | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.model = model
        self.engine = engine
        self.metrics = metrics or engine.metrics
        self.cache = cache or VectorCache(None, None, self.metrics)
        self.ready = False
        m = model.manifest
        # The exact graph file and tokenizer that compute the vectors: part of every cache key.
        self.model_digest = cache_keys.model_digest(
            m.graphs["encoder"][model.variant].sha256, m.tokenizer.files.get("tokenizer.json", "")
        )

    # --- endpoints --------------------------------------------------------------------------------

    async def embed(
        self, inputs: str | list[str], options: EmbedOptions, encoding: postprocess.Encoding = "float"
    ) -> tuple[list[Any], Timings]:
        """One encoded vector per input, in input order."""
        started = time.perf_counter()
        texts = self._texts(inputs)
        vectors, timings, _ = await self._vectors(texts, options)
        out = [postprocess.encode_vector(v, encoding) for v in vectors]
        timings.total_ms = _ms(time.perf_counter() - started)
        return out, timings

    async def embeddings(
        self, inputs: str | list[str], encoding: Literal["float", "base64"], dimensions: int | None
    ) -> tuple[list[Any], int, Timings]:
        """The OpenAI-compatible call: default options, one vector per input, and the tokens counted.

        Returns:
            The encoded vectors, the inputs' tokens ([CLS] and [SEP] included) and the timings.
        """
        started = time.perf_counter()
        if dimensions is not None and dimensions != self.model.hidden_size:
            raise ValidationFailed(
                f"dimensions {dimensions} is not supported: this model's vectors have "
                f"{self.model.hidden_size} dimensions (leave dimensions out)"
            )
        texts = self._texts(inputs)
        vectors, timings, tokens = await self._vectors(texts, EmbedOptions(), count_tokens=True)
        out = [postprocess.encode_vector(v, encoding) for v in vectors]
        timings.total_ms = _ms(time.perf_counter() - started)
        return out, sum(tokens[t] for t in texts), timings

    async def similarity(
        self,
        source: str | None,
        sentences: list[str] | None,
        pairs: list[list[str]] | None,
        options: EmbedOptions,
    ) -> tuple[list[float], Timings]:
        """Cosine of ``source`` with each of ``sentences``, or of each pair."""
        started = time.perf_counter()
        options = EmbedOptions(**{**options.__dict__, "normalize": True})
        if pairs is not None:
            texts = self._texts([t for pair in pairs for t in pair])
        else:
            if source is None or sentences is None:
                raise ValidationFailed("give inputs.source_sentence and inputs.sentences, or pairs")
            texts = self._texts([source, *sentences])
        vectors, timings, _ = await self._vectors(texts, options)
        if pairs is not None:
            scores = [float(vectors[2 * i] @ vectors[2 * i + 1]) for i in range(len(pairs))]
        else:
            scores = [float(vectors[0] @ v) for v in vectors[1:]]
        timings.total_ms = _ms(time.perf_counter() - started)
        return scores, timings

    async def fill_mask(self, inputs: str | list[str], top_k: int) -> tuple[list[Any], Timings]:
        """For each input, for each [MASK] in it, the ``top_k`` predictions like the HF pipeline."""
        started = time.perf_counter()
        self._check_ready()
        if not self.model.has_mlm_head:
            raise Unsupported("this model has no masked-LM head, so it cannot fill masks")
        texts = self._texts(inputs)
        info = self.model.manifest.tokenizer
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts)
            ticket = Ticket()
            items = []
            for i, enc in enumerate(encodings):
                ids = np.asarray(enc.ids, dtype=np.int64)
                self._check_length(i, len(ids))
                positions = tuple(int(p) for p in np.flatnonzero(ids == info.mask_id))
                if not positions:
                    raise ValidationFailed(f"inputs[{i}] has no [MASK] token")
                items.append(self._item(ids, Need(mask_positions=positions), ticket))
            results = await self.engine.run(items, ticket)
        answer = []
        for item, result in zip(items, results, strict=True):
            assert result.mask_probs is not None
            answer.append(self._predictions(item, result.mask_probs, top_k))
        timings = _timings(results, tokenization_ms)
        timings.total_ms = _ms(time.perf_counter() - started)
        return answer, timings

    async def tokenize(self, inputs: str | list[str], add_special_tokens: bool) -> tuple[list[Any], Timings]:
        """Tokens with ids, text and character offsets, per input."""
        started = time.perf_counter()
        self._check_ready()
        texts = self._texts(inputs)
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts, add_special_tokens)
        answer = [
            [
                {"id": tid, "text": tok, "special": bool(special), "start": start, "stop": stop}
                for tid, tok, special, (start, stop) in zip(
                    enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
                )
            ]
            for enc in encodings
        ]
        timings = Timings(tokenization_ms=tokenization_ms, total_ms=_ms(time.perf_counter() - started))
        return answer, timings

    def info(self) -> dict[str, Any]:
        m = self.model.manifest
        s = self.settings
        return {
            "model_id": m.source.model,
            "revision": m.source.revision,
            "weights": m.source.weights,
            "variant": self.model.variant,
            "provider": self.model.providers[0],
            "providers": self.model.providers,
            "choice": self.model.reason,
            "num_layers": m.config.num_layers,
            "hidden_size": m.config.hidden_size,
            "has_pooler": self.model.has_pooler,
            "has_mlm_head": self.model.has_mlm_head,
            "max_input_length": m.tokenizer.max_length,
            "max_input_chars": s.max_input_chars,
            "max_inputs_per_request": s.max_inputs_per_request,
            "batching": {
                "max_batch_tokens": s.max_batch_tokens,
                "max_batch_size": s.max_batch_size,
                "max_wait_ms": s.max_wait_ms,
                "max_concurrent_inputs": s.max_concurrent_inputs,
            },
            "ready": self.ready,
            "version": __version__,
            "stats": self.engine.stats(),
            "cache": self.cache.stats(),
        }

    async def warmup(self) -> None:
        """Embed and fill a few inputs of typical shapes so the first real request pays no set-up."""
        texts = list(_WARMUP_TEXTS)
        for batch in ([texts[0]], texts, texts * 3):
            await self._vectors(batch, EmbedOptions(long_text="truncate"), check_ready=False, use_cache=False)
        if self.model.has_mlm_head:
            ids = np.array(
                [
                    self.model.manifest.tokenizer.cls_id,
                    self.model.manifest.tokenizer.mask_id,
                    self.model.manifest.tokenizer.sep_id,
                ],
                dtype=np.int64,
            )
            ticket = Ticket()
            await self.engine.run([self._item(ids, Need(mask_positions=(1,)), ticket)], ticket)
        self.ready = True

    # --- shared steps -----------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if not self.ready:
            raise NotReady("the model is still warming up")

    def _texts(self, inputs: str | list[str]) -> list[str]:
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not texts:
            raise EmptyInput("inputs is empty")
        if len(texts) > self.settings.max_inputs_per_request:
            raise ValidationFailed(
                f"{len(texts)} inputs in one request; the limit is {self.settings.max_inputs_per_request}"
            )
        for i, text in enumerate(texts):
            if not text:
                raise EmptyInput(f"inputs[{i}] is empty")
            if len(text) > self.settings.max_input_chars:
                raise ValidationFailed(
                    f"inputs[{i}] has {len(text)} characters; the limit is {self.settings.max_input_chars}"
                )
        return texts

    def _layers(self, options: EmbedOptions) -> tuple[int, ...]:
        n = self.model.num_layers
        if options.pooling == "pooler":
            if not self.model.has_pooler:
                raise Unsupported("this model has no pooler; use pooling cls or mean")
            if options.layers not in (None, (n,), (-1,)):
                raise ValidationFailed("pooling 'pooler' reads the last layer only; leave out layers")
            return (n,)
        if options.layers is None:
            return (n,)
        if not options.layers:
            raise ValidationFailed("layers is empty")
        if len(options.layers) > n:
            raise ValidationFailed(f"at most {n} layers, got {len(options.layers)}")
        resolved = []
        for layer in options.layers:
            if not (1 <= layer <= n or -n <= layer <= -1):
                raise ValidationFailed(f"layer {layer} is out of range: use 1..{n} or -{n}..-1")
            resolved.append(layer if layer > 0 else n + 1 + layer)
        return tuple(resolved)

    def _check_length(self, index: int, tokens: int) -> None:
        limit = self.model.tokenizer.max_length
        if tokens > limit:
            raise ValidationFailed(
                f"inputs[{index}] has {tokens} tokens, over the model's limit of {limit}; "
                "send long_text 'truncate' or 'chunk' to embed it anyway"
            )

    async def _tokenize(
        self, texts: list[str], add_special_tokens: bool = True
    ) -> tuple[list[TokenEncoding], float]:
        started = time.perf_counter()
        encodings = await self.engine.tokenize(texts, add_special_tokens)
        seconds = time.perf_counter() - started
        self.metrics.tokenized(seconds)
        return encodings, _ms(seconds)

    def _item(self, ids: np.ndarray, need: Need, ticket: Ticket) -> WorkItem:
        loop = asyncio.get_running_loop()
        return WorkItem(ids=ids, need=need, ticket=ticket, loop=loop, future=loop.create_future())

    def _prepare(
        self,
        encodings: list[TokenEncoding],
        need: Need,
        options: EmbedOptions,
        ticket: Ticket,
        indices: list[int] | None = None,
    ) -> _Prepared:
        """Work items for each input: itself, its truncation, or its windows.

        ``indices`` are the inputs' positions in the request, for error messages (default 0, 1, …).
        """
        info = self.model.manifest.tokenizer
        limit = self.model.tokenizer.max_length
        per_window = limit - 2  # room for [CLS] and [SEP]
        cls, sep = np.array([info.cls_id], np.int64), np.array([info.sep_id], np.int64)
        prepared = _Prepared([], [], [])
        for i, enc in enumerate(encodings):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if len(ids) <= limit:
                windows = [ids]
            elif options.long_text == "error":
                self._check_length(indices[i] if indices is not None else i, len(ids))
                windows = []
            else:
                body = ids[1:-1]
                if options.long_text == "truncate":
                    kept = (
                        body[:per_window] if options.truncation_direction == "right" else body[-per_window:]
                    )
                    windows = [np.concatenate([cls, kept, sep])]
                else:
                    windows = [
                        np.concatenate([cls, body[s : s + per_window], sep])
                        for s in range(0, len(body), per_window)
                    ]
            for window in windows:
                prepared.items.append(self._item(window, need, ticket))
                prepared.owner.append(i)
                prepared.weights.append(max(len(window) - 2, 1))
        return prepared

    async def _vectors(
        self,
        texts: list[str],
        options: EmbedOptions,
        check_ready: bool = True,
        use_cache: bool = True,
        count_tokens: bool = False,
    ) -> tuple[list[np.ndarray], Timings, dict[str, int]]:
        """The combined (and optionally normalised) float32 vector of each text, through the cache.

        Returns:
            The vectors, the timings of what was computed, and (with ``count_tokens``) each text's tokens.
        """
        if check_ready:
            self._check_ready()
        layers = self._layers(options)
        need = Need(layers=layers, pooling=options.pooling)
        first = {text: i for i, text in reversed(list(enumerate(texts)))}
        computed = _Computed()

        async def compute(todo: list[str]) -> list[np.ndarray]:
            encodings, tokenization_ms = await self._tokenize(todo)
            computed.tokenization_ms += tokenization_ms
            computed.tokens.update((t, len(e.ids)) for t, e in zip(todo, encodings, strict=True))
            ticket = Ticket()
            prepared = self._prepare(encodings, need, options, ticket, [first[t] for t in todo])
            results = await self.engine.run(prepared.items, ticket)
            computed.results.extend(results)
            return self._assemble(len(todo), prepared, results, options)

        # Permits cover every input, cached or not: they bound the in-flight map and the queues behind it.
        with self.engine.admit(len(texts)):
            if use_cache:
                vectors = await self.cache.vectors(self._key_prefix(options, layers), texts, compute)
            else:
                vectors = await compute(texts)
            if count_tokens and (uncounted := [t for t in first if t not in computed.tokens]):
                encodings, _ = await self._tokenize(uncounted)
                computed.tokens.update((t, len(e.ids)) for t, e in zip(uncounted, encodings, strict=True))
        return vectors, _timings(computed.results, computed.tokenization_ms), computed.tokens

    def _assemble(
        self, count: int, prepared: _Prepared, results: list[ItemResult], options: EmbedOptions
    ) -> list[np.ndarray]:
        per_input: list[list[np.ndarray]] = [[] for _ in range(count)]
        weights: list[list[int]] = [[] for _ in range(count)]
        for owner, weight, result in zip(prepared.owner, prepared.weights, results, strict=True):
            assert result.vectors is not None
            per_input[owner].append(postprocess.combine_layers(result.vectors, options.layer_combine))
            weights[owner].append(weight)
        vectors = [postprocess.weighted_average(v, w) for v, w in zip(per_input, weights, strict=True)]
        if options.normalize:
            vectors = [postprocess.normalize(v) for v in vectors]
        return vectors

    def _key_prefix(self, options: EmbedOptions, layers: tuple[int, ...]) -> str:
        """Everything besides the text that changes a vector: model, pooling, layers and the rest."""
        return cache_keys.space(
            self.model_digest,
            {
                "pooling": options.pooling,
                "layers": list(layers),  # resolved: -1 and L are the same vector
                "layer_combine": options.layer_combine,
                "normalize": options.normalize,
                "long_text": options.long_text,
                "truncation_direction": options.truncation_direction,
            },
        )

    def _predictions(self, item: WorkItem, probs: np.ndarray, top_k: int) -> list[list[dict[str, Any]]]:
        tokenizer = self.model.tokenizer
        single = len(item.need.mask_positions) == 1
        out = []
        for position, row in zip(item.need.mask_positions, probs, strict=True):
            ids, scores = postprocess.top_k(row, top_k)
            predictions = []
            for token, score in zip(ids, scores, strict=True):
                filled = item.ids.copy()
                filled[position] = token
                predictions.append(
                    {
                        "score": score,
                        "token": token,
                        "token_str": tokenizer.decode([token], skip_special_tokens=False),
                        # Like the HF pipeline: with several masks the others stay visible.
                        "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=single),
                    }
                )
            out.append(predictions)
        return out


def _ms(seconds: float) -> float:
    return seconds * 1000


def _timings(results: list[ItemResult], tokenization_ms: float) -> Timings:
    """Queue time is the longest any item waited; inference time sums the batches the request used."""
    batches = {r.batch_started: r.inference_s for r in results}
    return Timings(
        queue_ms=_ms(max((r.queued_s for r in results), default=0.0)),
        tokenization_ms=tokenization_ms,
        inference_ms=_ms(sum(batches.values())),
    )
