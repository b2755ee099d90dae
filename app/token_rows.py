"""/embed_all's token rows: which positions run, which rows come back, and how they are described."""

from __future__ import annotations

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app import layers
from app.answers import TokenVectors
from app.errors import InternalError, ValidationFailed
from app.options import Direction, EmbedAllOptions, LayerMix
from app.windows import truncated_positions


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


def kept_positions(length: int, limit: int, direction: Direction) -> np.ndarray:
    """The positions of an encoding of ``length`` tokens that run: all, or its truncation to ``limit``."""
    if length <= limit:
        return np.arange(length)
    return truncated_positions(length, limit, direction)


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
