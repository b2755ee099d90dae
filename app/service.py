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
from app.errors import EmptyInput, InternalError, NotReady, Unsupported, ValidationFailed
from app.metrics import Metrics
from app.model.runtime import OnnxModel
from app.settings import Settings

LongText = Literal["error", "truncate", "chunk"]
Direction = Literal["right", "left"]

# Each [MASK] holds a probability row over the vocabulary (bert-base-chinese: 21128 floats, 84 kB) until
# its request is answered, and costs top_k decodes on the event loop; this keeps one request near 10 MB.
MAX_MASKS_PER_REQUEST = 128

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
    layer_weights: tuple[float, ...] | None = None  # layer_combine "weighted": one per layer, as sent
    long_text: LongText = "error"
    truncation_direction: Direction = "right"
    normalize: bool = True


@dataclass(frozen=True)
class EmbedAllOptions:
    """What /embed_all returns for each token; the layer options mean what they mean for /embed."""

    layers: tuple[int, ...] | None = None
    layer_combine: postprocess.LayerCombine = "concat"
    layer_weights: tuple[float, ...] | None = None
    long_text: LongText = "error"  # "chunk" is refused (see Service.embed_all)
    truncation_direction: Direction = "right"
    normalize: bool = False  # each token's vector to unit length
    special_tokens: bool = False  # also return [CLS] and [SEP]
    return_tokens: bool = False  # each token's id, text and character span in the input
    norms: bool = False  # each token's L2 norm (before normalisation)


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

    async def embed_all(
        self,
        inputs: str | list[str],
        options: EmbedAllOptions,
        encoding: Literal["float", "base64"] = "float",
    ) -> tuple[list[Any], Timings]:
        """Per input, the vector of each of its tokens, in order; never a padding position.

        A token's vector is its layers' states combined by ``layer_combine``, then (``normalize``)
        scaled to unit length; ``norms`` are taken before that. Spans index the original text in
        characters (code points, like Python's ``str``). Not cached: one input's token matrix weighs as
        much as a hundred sentence vectors in the byte-bounded cache and is rarely asked for twice.

        Returns:
            Per input its list of token vectors (TEI's shape) or, with ``return_tokens`` or ``norms``,
            ``{"vectors": [...], "tokens": [...], "norms": [...]}`` (only the parts asked for); and the
            timings.

        Raises:
            ValidationFailed: long_text "chunk"; an input over the model's length with long_text
                "error"; more tokens than ``max_embed_all_tokens``; layers or weights that do not fit.
        """
        started = time.perf_counter()
        self._check_ready()
        if options.long_text == "chunk":
            raise ValidationFailed(
                "long_text 'chunk' is not available on /embed_all: a token's vector depends on the whole "
                "sequence around it, so windows embedded apart would not give the text's token vectors; "
                "send long_text 'truncate' (or truncate: true), or split the text yourself"
            )
        texts = self._texts(inputs)
        layers = self._resolve_layers(options.layers)
        mix = postprocess.layer_mix(options.layer_combine, len(layers), options.layer_weights)
        with self.engine.admit(len(texts)):
            encodings, tokenization_ms = await self._tokenize(texts)
            # Per input: the positions of its encoding that run (all, or a truncation) and, of those,
            # the rows that are returned (without [CLS]/[SEP] unless asked for).
            kept = [self._kept_positions(i, len(enc.ids), options) for i, enc in enumerate(encodings)]
            rows = []
            for enc, k in zip(encodings, kept, strict=True):
                special = np.asarray(enc.special_tokens_mask, dtype=bool)[k]
                rows.append(np.arange(len(k)) if options.special_tokens else np.flatnonzero(~special))
            self._check_token_bound(sum(len(r) for r in rows), len(layers) if mix.how == "concat" else 1)
            ticket = Ticket()
            need = Need(layers=layers, tokens=True)
            items = [
                self._item(np.asarray(enc.ids, dtype=np.int64)[k], need, ticket)
                for enc, k in zip(encodings, kept, strict=True)
            ]
            results = await self.engine.run(items, ticket)
        answer = [
            self._token_vectors(enc, k, r, result, mix, options, encoding)
            for enc, k, r, result in zip(encodings, kept, rows, results, strict=True)
        ]
        timings = _timings(results, tokenization_ms)
        timings.total_ms = _ms(time.perf_counter() - started)
        return answer, timings

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
            masks = 0
            for i, enc in enumerate(encodings):
                ids = np.asarray(enc.ids, dtype=np.int64)
                self._check_length(
                    i, len(ids), "fill-mask cannot truncate: shorten the text around the masks"
                )
                positions = tuple(int(p) for p in np.flatnonzero(ids == info.mask_id))
                if not positions:
                    raise ValidationFailed(f"inputs[{i}] has no [MASK] token")
                masks += len(positions)
                if masks > MAX_MASKS_PER_REQUEST:
                    raise ValidationFailed(
                        f"inputs[:{i + 1}] hold {masks} [MASK] tokens; the limit is {MAX_MASKS_PER_REQUEST} "
                        "per request"
                    )
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
            "max_embed_all_tokens": s.max_embed_all_tokens,
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
        return self._resolve_layers(options.layers)

    def _resolve_layers(self, layers: tuple[int, ...] | None) -> tuple[int, ...]:
        """Requested layers (1-based or negative from the end; None = the last) as 1-based layers."""
        n = self.model.num_layers
        if layers is None:
            return (n,)
        if not layers:
            raise ValidationFailed("layers is empty")
        if len(layers) > n:
            raise ValidationFailed(f"at most {n} layers, got {len(layers)}")
        resolved = []
        for layer in layers:
            if not (1 <= layer <= n or -n <= layer <= -1):
                raise ValidationFailed(f"layer {layer} is out of range: use 1..{n} or -{n}..-1")
            resolved.append(layer if layer > 0 else n + 1 + layer)
        return tuple(resolved)

    def _check_length(self, index: int, tokens: int, remedy: str | None = None) -> None:
        limit = self.model.tokenizer.max_length
        if tokens > limit:
            remedy = remedy or "send long_text 'truncate' or 'chunk' to embed it anyway"
            raise ValidationFailed(
                f"inputs[{index}] has {tokens} tokens, over the model's limit of {limit}; {remedy}"
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
                    windows = [ids[truncated_positions(len(ids), limit, options.truncation_direction)]]
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
        mix = postprocess.layer_mix(options.layer_combine, len(layers), options.layer_weights)
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
            return self._assemble(len(todo), prepared, results, options, mix)

        # Permits cover every input, cached or not: they bound the in-flight map and the queues behind it.
        with self.engine.admit(len(texts)):
            if use_cache:
                vectors = await self.cache.vectors(self._key_prefix(options, layers, mix), texts, compute)
            else:
                vectors = await compute(texts)
            if count_tokens and (uncounted := [t for t in first if t not in computed.tokens]):
                encodings, _ = await self._tokenize(uncounted)
                computed.tokens.update((t, len(e.ids)) for t, e in zip(uncounted, encodings, strict=True))
        return vectors, _timings(computed.results, computed.tokenization_ms), computed.tokens

    def _assemble(
        self,
        count: int,
        prepared: _Prepared,
        results: list[ItemResult],
        options: EmbedOptions,
        mix: postprocess.LayerMix,
    ) -> list[np.ndarray]:
        per_input: list[list[np.ndarray]] = [[] for _ in range(count)]
        weights: list[list[int]] = [[] for _ in range(count)]
        for owner, weight, result in zip(prepared.owner, prepared.weights, results, strict=True):
            assert result.vectors is not None
            per_input[owner].append(postprocess.combine_layers(result.vectors, mix))
            weights[owner].append(weight)
        vectors = [postprocess.weighted_average(v, w) for v, w in zip(per_input, weights, strict=True)]
        if options.normalize:
            vectors = [postprocess.normalize(v) for v in vectors]
        return vectors

    def _check_token_bound(self, tokens: int, width: int) -> None:
        """Refuse an /embed_all answer over ``max_embed_all_tokens`` token vectors, before inference.

        With ``concat`` each token's vector is ``width`` layers wide, so it counts ``width`` times: the
        bound is on the numbers sent back (and held in memory while they are), not only on tokens.
        """
        total, limit = tokens * width, self.settings.max_embed_all_tokens
        if total > limit:
            how = f" ({tokens} tokens × {width} concatenated layers)" if width > 1 else ""
            fewer = "fewer or shorter inputs" + (", or fewer layers" if width > 1 else "")
            raise ValidationFailed(
                f"this request would return {total} token vectors{how}; the limit is {limit} per "
                f"request (max_embed_all_tokens): send {fewer}"
            )

    def _kept_positions(self, index: int, length: int, options: EmbedAllOptions) -> np.ndarray:
        """The positions of an encoding of ``length`` tokens that run: all, or its truncation."""
        limit = self.model.tokenizer.max_length
        if length <= limit:
            return np.arange(length)
        if options.long_text == "error":
            self._check_length(index, length)
        return truncated_positions(length, limit, options.truncation_direction)

    def _token_vectors(
        self,
        enc: TokenEncoding,
        kept: np.ndarray,
        rows: np.ndarray,
        result: ItemResult,
        mix: postprocess.LayerMix,
        options: EmbedAllOptions,
        encoding: Literal["float", "base64"],
    ) -> Any:
        """One input's answer on /embed_all: its ``rows`` combined, encoded, and described if asked."""
        if result.token_states is None:
            raise InternalError("an /embed_all item came back without its token states")
        vectors = postprocess.combine_layers(result.token_states[:, rows], mix)
        norms = postprocess.row_norms(vectors) if options.norms else None
        if options.normalize:
            vectors = postprocess.normalize_rows(vectors)
        encoded = postprocess.encode_rows(vectors, encoding)
        if not (options.return_tokens or options.norms):
            return encoded
        entry: dict[str, Any] = {"vectors": encoded}
        if options.return_tokens:
            # Each Encoding property builds a new list on access: read each once.
            ids, tokens, special, offsets = enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets
            entry["tokens"] = [
                {
                    "id": ids[p],
                    "text": tokens[p],
                    "special": bool(special[p]),
                    "start": offsets[p][0],
                    "stop": offsets[p][1],
                }
                for p in kept[rows].tolist()
            ]
        if norms is not None:
            entry["norms"] = norms.tolist()
        return entry

    def _key_prefix(self, options: EmbedOptions, layers: tuple[int, ...], mix: postprocess.LayerMix) -> str:
        """Everything besides the text that changes a vector: model, pooling, layers and the rest."""
        return cache_keys.space(
            self.model_digest,
            {
                "pooling": options.pooling,
                "layers": list(layers),  # resolved: -1 and L are the same vector
                "layer_combine": options.layer_combine,
                "layer_weights": list(mix.weights) if mix.weights is not None else None,  # scaled to sum 1
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


def truncated_positions(length: int, limit: int, direction: Direction) -> np.ndarray:
    """Positions a sequence of ``length`` tokens keeps when truncated to ``limit``: [CLS], the first
    (right) or last (left) ``limit - 2`` tokens of its body, and [SEP]."""
    body = limit - 2
    start = 1 if direction == "right" else length - 1 - body
    return np.concatenate([[0], np.arange(start, start + body), [length - 1]])


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
