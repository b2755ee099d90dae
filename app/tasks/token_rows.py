"""/embed_all's token rows: which rows come back of the positions that run (:mod:`app.tasks.prepare`),
and how they are described; /tokenize's table."""

from __future__ import annotations

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app.errors import InternalError, ValidationFailed
from app.tasks import layers
from app.tasks.answers import TokenVectors
from app.tasks.options import EmbedAllOptions, LayerMix


def check_long_text(options: EmbedAllOptions) -> None:
    """Refuse long_text "chunk": token vectors cannot be had from windows embedded apart.

    Raises:
        ValidationFailed: long_text "chunk".
    """
    if options.long_text == "chunk":
        raise ValidationFailed(
            "long_text 'chunk' is not available on /embed_all: a token's vector depends on the whole "
            "sequence around it, so windows embedded apart would not give the text's token vectors; "
            "send long_text 'truncate' (or truncate: true), or split the text yourself"
        )


def token_table(encodings: list[TokenEncoding]) -> list[list[dict[str, object]]]:
    """/tokenize's answer: per input, each token's id, text, whether special, and character span."""
    return [
        [
            {"id": tid, "text": tok, "special": bool(special), "start": start, "stop": stop}
            for tid, tok, special, (start, stop) in zip(
                enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
            )
        ]
        for enc in encodings
    ]


def check_token_bound(tokens: int, width: int, limit: int) -> None:
    """Refuse an /embed_all answer over ``limit`` (``max_embed_all_tokens``) token vectors, before inference.

    With ``concat`` each token's vector is ``width`` layers wide, so it counts ``width`` times: the
    bound is on the numbers sent back (and held in memory while they are), not only on tokens.

    Raises:
        ValidationFailed: over the bound.
    """
    total = tokens * width
    if total > limit:
        how = f" ({tokens} tokens × {width} concatenated layers)" if width > 1 else ""
        fewer = "fewer or shorter inputs" + (", or fewer layers" if width > 1 else "")
        raise ValidationFailed(
            f"this request would return {total} token vectors{how}; the limit is {limit} per "
            f"request (max_embed_all_tokens): send {fewer}"
        )


def returned_rows(enc: TokenEncoding, kept: np.ndarray, special_tokens: bool) -> np.ndarray:
    """Of the ``kept`` positions, the rows that are returned (without [CLS]/[SEP] unless asked for)."""
    if special_tokens:
        return np.arange(len(kept))
    special = np.asarray(enc.special_tokens_mask, dtype=bool)[kept]
    return np.flatnonzero(~special)


def token_vectors(
    enc: TokenEncoding,
    kept: np.ndarray,
    rows: np.ndarray,
    states: np.ndarray | None,
    mix: LayerMix,
    options: EmbedAllOptions,
) -> TokenVectors:
    """One input's answer on /embed_all: its ``rows`` of ``states`` [layers, tokens, hidden] combined,
    and described if asked.

    Raises:
        InternalError: the sequence came back without its token states.
    """
    if states is None:
        raise InternalError("an /embed_all sequence came back without its token states")
    vectors = layers.combine_layers(states[:, rows], mix)
    norms = layers.row_norms(vectors) if options.norms else None
    if options.normalize:
        vectors = layers.normalize_rows(vectors)
    answer = TokenVectors(vectors, norms=norms)
    if options.return_tokens:
        # Each Encoding property builds a new list on access: read each once.
        ids, tokens, special, offsets = enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets
        answer.tokens = [
            {
                "id": ids[p],
                "text": tokens[p],
                "special": bool(special[p]),
                "start": offsets[p][0],
                "stop": offsets[p][1],
            }
            for p in kept[rows].tolist()
        ]
    return answer
