"""Fill-mask's ``sequence`` texts, as ``tokenizer.decode`` writes them, without decoding the whole input
per candidate (128 masks × 50 took seconds). A WordPiece decoder writes each token apart, so each side of
the candidate is joined once per mask, and clean-up (never across a character outside ``CLEANUP_CHARS``)
runs per candidate only around it. Other decoders decode each candidate whole (:class:`WholeDecodes`)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import decoders

from app.model.tokenizer import CLEANUP_CHARS, TextTokenizer

# A token the decoder writes as itself at the start: decode([ANCHOR, t]) is ANCHOR, then t's piece.
_ANCHOR = "a"
_CLEANUP = "".join(CLEANUP_CHARS)  # str.strip's set of characters


class MaskTexts:
    """The decoded texts of one tokenizer's inputs with one token replaced, for one request;
    ``skip_special`` as ``decode``'s ``skip_special_tokens`` (the pipeline's choice for one [MASK])."""

    def __init__(self, tokenizer: TextTokenizer, skip_special: bool) -> None:
        backend = tokenizer.backend
        self._tokenizer = tokenizer
        self._decoder = backend.decoder
        self._token = backend.id_to_token
        self._special = {i for i, added in backend.get_added_tokens_decoder().items() if added.special}
        self._skip = skip_special
        self._first: dict[int, str] = {}
        self._later: dict[int, str] = {}

    @staticmethod
    def fits(tokenizer: TextTokenizer) -> bool:
        """Whether ``tokenizer``'s decoder writes each token apart (WordPiece), as this class assumes."""
        decoder = tokenizer.backend.decoder
        return isinstance(decoder, decoders.WordPiece) and decoder.decode([_ANCHOR]) == _ANCHOR

    def _kept(self, token: int) -> bool:  # decode drops an id outside the vocabulary, and skipped specials
        return not (self._skip and token in self._special) and self._token(token) is not None

    def _piece(self, token: int, first: bool) -> str:
        cache = self._first if first else self._later
        piece = cache.get(token)
        if piece is None:
            text = self._token(token) or ""
            written = self._decoder.decode([text] if first else [_ANCHOR, text])
            piece = cache[token] = written if first else written[len(_ANCHOR) :]
        return piece

    def filled(self, ids: Sequence[int], position: int, tokens: Sequence[int]) -> list[str]:
        """``decode(ids)`` with ``ids[position]`` replaced by each of ``tokens``, in their order."""
        before = [t for t in ids[:position] if self._kept(t)]
        after = [t for t in ids[position + 1 :] if self._kept(t)]
        head = "".join(self._piece(t, i == 0) for i, t in enumerate(before))
        tail = "".join(self._piece(t, False) for t in after)
        # A dropped candidate leaves the first token after it first, when none is before it.
        tail_alone = tail if before else "".join(self._piece(t, i == 0) for i, t in enumerate(after))
        first = not before  # the candidate is the first token written
        if not self._tokenizer.clean_up_spaces:
            return [
                head + self._piece(t, first) + tail if self._kept(t) else head + tail_alone for t in tokens
            ]
        # Cleaned once per mask: the head up to its last character no clean-up reads, the tails from
        # their first; cleaned per candidate: the few characters between, around the candidate.
        clean = self._tokenizer.clean
        cut = len(head.rstrip(_CLEANUP))
        head_done, head_open = clean(head[:cut]), head[cut:]
        ends: dict[bool, tuple[str, str]] = {}
        for kept, rest in ((True, tail), (False, tail_alone)):
            cut = len(rest) - len(rest.lstrip(_CLEANUP)) + 1
            ends[kept] = rest[:cut], clean(rest[cut:])
        out = []
        for token in tokens:
            kept = self._kept(token)
            inside, tail_done = ends[kept]
            middle = head_open + (self._piece(token, first) if kept else "") + inside
            out.append(head_done + clean(middle) + tail_done)
        return out


class WholeDecodes:
    """:class:`MaskTexts`' answers by decoding each candidate's whole input."""

    def __init__(self, tokenizer: TextTokenizer, skip_special: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special

    def filled(self, ids: Sequence[int], position: int, tokens: Sequence[int]) -> list[str]:
        head, tail = ids[:position], ids[position + 1 :]
        return [self._tokenizer.decode([*head, t, *tail], skip_special_tokens=self._skip) for t in tokens]


def mask_texts(tokenizer: TextTokenizer, skip_special: bool) -> MaskTexts | WholeDecodes:
    """What writes one request's filled texts for ``tokenizer``: pieces where its decoder allows."""
    return (MaskTexts if MaskTexts.fits(tokenizer) else WholeDecodes)(tokenizer, skip_special)
