"""The per-token tasks: each input's tokens with ids, text and character offsets (``/tokenize``, TEI's
``Tokenize``), and the vector of each token (``/embed_all``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app.engine.work import Need
from app.errors import InternalError, ValidationFailed
from app.tasks import layers
from app.tasks.answers import Answer, TokenVectors, timed, timings_of
from app.tasks.core import Task
from app.tasks.options import EmbedAllOptions, LayerMix, listed, resolve_embed_all
from app.tasks.prepare import TOO_LONG_TOKENS, from_encodings
from app.telemetry.timings import Timings


class Tokens(Task):
    @timed
    async def tokenize(self, inputs: str | list[str], add_special_tokens: bool) -> Answer[list[Any]]:
        """Tokens with ids, text and character offsets, per input; the permits held until the table is
        built (as gRPC's ``Tokenize`` holds them), so the answers in the making are bounded too."""
        self.core.check_ready()
        texts = self.core.texts(inputs, listed("inputs", inputs))
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.engine.tokenize(texts, add_special_tokens)
            check_tokenize_bound(encodings, self.core.settings.max_tokenize_tokens)
            # Off the event loop: a dict per token, up to max_tokenize_tokens of them (~1 µs each).
            table = await asyncio.to_thread(token_table, encodings)
        return Answer(table, Timings(tokenization_ms=tokenization_ms))

    @timed
    async def embed_all(
        self, inputs: str | list[str], options: EmbedAllOptions
    ) -> Answer[list[TokenVectors]]:
        """/embed_all: per input, the vector of each of its tokens (and tokens and norms if asked). Not
        cached: a token matrix weighs a hundred sentence vectors and is rarely asked for twice."""
        self.core.check_ready()
        if options.long_text == "chunk":
            raise ValidationFailed(
                "long_text 'chunk' is not available on /embed_all: a token's vector depends on the whole "
                "sequence around it, so windows embedded apart would not give the text's token vectors; "
                "send long_text 'truncate' (or truncate: true), or split the text yourself"
            )
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        resolved = resolve_embed_all(options, self.core.model.num_layers)
        rules = self.core.rules(TOO_LONG_TOKENS, options.long_text, options.truncation_direction)
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.engine.tokenize(texts)
            prepared = from_encodings(encodings, rules, names.item)
            prepared.refuse()
            kept = [prepared.positions(k) for k in range(len(texts))]
            rows = [returned_rows(e, k, options.special_tokens) for e, k in zip(encodings, kept, strict=True)]
            tokens = sum(len(r) for r in rows)
            check_token_bound(tokens, len(resolved.layers), self.core.settings.max_embed_all_tokens)
            job = await self.core.run(prepared.ids, Need(layers=resolved.layers, tokens=True))
        # Off the event loop: layers combined over up to max_embed_all_tokens rows, tens of milliseconds.
        answer = await asyncio.to_thread(
            lambda: [
                token_vectors(enc, k, r, states, resolved.mix, options)
                for enc, k, r, states in zip(encodings, kept, rows, job.token_states, strict=True)
            ]
        )
        return Answer(answer, timings_of([job], tokenization_ms))


def check_tokenize_bound(encodings: list[TokenEncoding], limit: int) -> None:
    """Refuse a /tokenize answer of more than ``limit`` (``max_tokenize_tokens``) tokens in all."""
    tokens = sum(len(e) for e in encodings)
    if tokens > limit:
        raise ValidationFailed(
            f"this request would return {tokens} tokens; the limit is {limit} per request "
            "(max_tokenize_tokens): send fewer or shorter inputs"
        )


def token_table(encodings: list[TokenEncoding]) -> list[list[dict[str, object]]]:
    return [described(enc, range(len(enc))) for enc in encodings]


def described(enc: TokenEncoding, positions: Iterable[int]) -> list[dict[str, object]]:
    """The tokens of ``enc`` at ``positions``: each one's id, text, whether special, and character span."""
    # Each Encoding property builds a new list on access: read each once.
    ids, tokens, special, offsets = enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets
    return [
        {
            "id": ids[p],
            "text": tokens[p],
            "special": bool(special[p]),
            "start": offsets[p][0],
            "stop": offsets[p][1],
        }
        for p in positions
    ]


def check_token_bound(tokens: int, layers: int, limit: int) -> None:
    """Refuse an /embed_all request over ``limit`` (``max_embed_all_tokens``) token vectors, before
    inference; each token counts once per layer, whatever the mix (every layer's rows are held)."""
    total = tokens * layers
    if total > limit:
        how = f" ({tokens} tokens × {layers} layers held)" if layers > 1 else ""
        fewer = "fewer or shorter inputs" + (", or fewer layers" if layers > 1 else "")
        raise ValidationFailed(
            f"this request would hold {total} token vectors{how}; the limit is {limit} per "
            f"request (max_embed_all_tokens): send {fewer}"
        )


def returned_rows(enc: TokenEncoding, kept: np.ndarray, special_tokens: bool) -> np.ndarray:
    """Of the ``kept`` positions, the rows that are returned (without [CLS]/[SEP] unless asked for)."""
    if special_tokens:
        return np.arange(len(kept))
    return np.flatnonzero(~np.asarray(enc.special_tokens_mask, dtype=bool)[kept])


def token_vectors(
    enc: TokenEncoding,
    kept: np.ndarray,
    rows: np.ndarray,
    states: np.ndarray | None,
    mix: LayerMix,
    options: EmbedAllOptions,
) -> TokenVectors:
    """One input's answer on /embed_all: its ``rows`` of ``states`` [layers, tokens, hidden] combined."""
    if states is None:
        raise InternalError("an /embed_all sequence came back without its token states")
    vectors = layers.combine_layers(states[:, rows], mix)
    norms = layers.row_norms(vectors) if options.norms else None
    if options.normalize:
        vectors = layers.normalize_rows(vectors)
    tokens = described(enc, kept[rows].tolist()) if options.return_tokens else None
    return TokenVectors(vectors, tokens, norms)
