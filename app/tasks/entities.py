"""Named entities from one input's per-token class probabilities, as transformers'
``TokenClassificationPipeline`` (4.57, fast tokenizer, offsets) gives them, in numpy and tokenizers alone.
Its quirks are kept, each marked "Quirk:" (they decide which tokens form a word and how a word reads)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from tokenizers import Tokenizer

from app.errors import ValidationFailed

AggregationStrategy = Literal["none", "simple", "first", "average", "max"]
STRATEGIES: tuple[AggregationStrategy, ...] = get_args(AggregationStrategy)


@dataclass(frozen=True)
class Vocabulary:
    """What :func:`entities` needs of the tokenizer; :func:`vocabulary` builds it from a tokenizer.json."""

    id_to_token: Callable[[int], str | None]
    # The fast tokenizer's convert_tokens_to_string: its decoder's decode, or the tokens joined by spaces.
    tokens_to_string: Callable[[list[str]], str]
    # "##" for WordPiece; None (or "") falls back to the pipeline's whitespace heuristic for subwords.
    continuing_subword_prefix: str | None
    # The pipeline's tokenizer.unk_token_id: such a token's word is its text. None: no token is unknown.
    unk_token_id: int | None = None


def vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    """The :class:`Vocabulary` of a tokenizer loaded from a tokenizer.json, as the pipeline reads it."""
    model, decoder = tokenizer.model, tokenizer.decoder
    unk = getattr(model, "unk_token", None)
    return Vocabulary(
        id_to_token=tokenizer.id_to_token,
        tokens_to_string=decoder.decode if decoder is not None else " ".join,
        continuing_subword_prefix=getattr(model, "continuing_subword_prefix", None) or None,
        unk_token_id=tokenizer.token_to_id(unk) if unk else None,
    )


@dataclass
class _Token:
    """One non-special token: the pipeline's "pre-entity"."""

    word: str
    scores: np.ndarray
    start: int
    end: int
    index: int
    is_subword: bool


def entities(
    text: str,
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    special: Sequence[int],
    probs: np.ndarray,
    id2label: Mapping[int, str],
    vocab: Vocabulary,
    strategy: AggregationStrategy = "simple",
    ignore_labels: Sequence[str] = ("O",),
) -> list[dict[str, Any]]:
    """The pipeline's answer for one input: its tokens with ``strategy="none"``, else its entity groups.

    ``ids``, ``offsets`` and ``special`` are the input's Encoding's, ``probs`` [len(ids), labels] the
    softmax of its token logits.
    """
    if strategy not in STRATEGIES:
        raise ValidationFailed(
            f"aggregation_strategy must be one of {', '.join(map(repr, STRATEGIES))}, not {strategy!r}"
        )
    if probs.ndim != 2 or not len(ids) == len(offsets) == len(special) == probs.shape[0]:
        raise ValueError(
            f"{len(ids)} ids, {len(offsets)} offsets and {len(special)} special flags "
            f"for probabilities of shape {probs.shape}"
        )
    tokens: list[_Token] = []  # the pipeline's gather_pre_entities
    for index, token_id in enumerate(ids):
        if special[index]:
            continue
        word = vocab.id_to_token(int(token_id))
        if word is None:
            raise ValueError(f"token id {token_id} is not in the vocabulary")
        start, end = int(offsets[index][0]), int(offsets[index][1])
        covered = text[start:end]
        # Quirk: a subword is a token whose text differs in length from what it covers (``##ing``: 5 to 3),
        # so is a word-initial token whose characters the normalizer changed in length.
        if vocab.continuing_subword_prefix:
            is_subword = len(word) != len(covered)
        else:
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if int(token_id) == vocab.unk_token_id:  # Quirk: its word is what it covers (``😀``), not a subword
            word = covered
            is_subword = False
        tokens.append(_Token(word, probs[index], start, end, index, is_subword))
    if strategy in ("none", "simple"):
        tagged = [_tag(t.scores, id2label, t.word, t.start, t.end, t.index) for t in tokens]
    else:
        words: list[list[_Token]] = []  # the pipeline's aggregate_words: a token and the subwords after it
        for token in tokens:
            if words and token.is_subword:
                words[-1].append(token)
            else:
                words.append([token])
        tagged = []
        for group in words:  # the pipeline's aggregate_word: one label for a word's tokens
            if strategy == "max":  # max() keeps the first of equal maxima, as the pipeline's does
                scores = max(group, key=lambda t: t.scores.max()).scores
            elif strategy == "first" or len(group) == 1:  # the mean of one row is that row
                scores = group[0].scores
            else:
                scores = np.nanmean(np.stack([t.scores for t in group]), axis=0)
            # Quirk: a word (and a group) reads as the decoder writes its tokens (WordPiece: ``王 小 明``).
            word = vocab.tokens_to_string([t.word for t in group])
            tagged.append(_tag(scores, id2label, word, group[0].start, group[-1].end))
    ignored = set(ignore_labels)
    if strategy == "none":
        return [{**t, "score": float(t["score"])} for t in tagged if t["entity"] not in ignored]
    return _groups(tagged, vocab, ignored)


def _tag(
    scores: np.ndarray, id2label: Mapping[int, str], word: str, start: int, end: int, index: int | None = None
) -> dict[str, Any]:
    """A token ("none", "simple") or a word (the other strategies) with its best label."""
    best = int(scores.argmax())
    return {
        "entity": id2label[best],
        "score": scores[best],
        "index": index,
        "word": word,
        "start": start,
        "end": end,
    }


def _tag_parts(label: str) -> tuple[str, str]:
    """The pipeline's ``get_tag``: ("B" or "I", the type); a label without B-/I- continues like I-."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _groups(tagged: list[dict[str, Any]], vocab: Vocabulary, ignored: set[str]) -> list[dict[str, Any]]:
    """The pipeline's ``group_entities``: adjacent tokens (or words) of one type, each B- starting anew.

    Quirk: a group is named by its first label past the first "-" (``S-ORG``: ``ORG``), and ``ignored``
    names are left out after grouping, so they still split groups.
    """
    groups: list[list[dict[str, Any]]] = []
    for t in tagged:
        bi, tag = _tag_parts(t["entity"])
        if groups and bi != "B" and tag == _tag_parts(groups[-1][-1]["entity"])[1]:
            groups[-1].append(t)
        else:
            groups.append([t])
    named = ((group[0]["entity"].split("-", 1)[-1], group) for group in groups)
    return [_group(name, group, vocab) for name, group in named if name not in ignored]


def _group(name: str, group: list[dict[str, Any]], vocab: Vocabulary) -> dict[str, Any]:
    """The pipeline's ``group_sub_entities``."""
    # The mean of one score is that score (numpy's float32 mean of one value gives it back unchanged).
    score = group[0]["score"] if len(group) == 1 else np.mean(np.nanmean([t["score"] for t in group]))
    return {
        "entity_group": name,
        "score": float(score),
        "word": vocab.tokens_to_string([t["word"] for t in group]),
        "start": group[0]["start"],
        "end": group[-1]["end"],
    }
