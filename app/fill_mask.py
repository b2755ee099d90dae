"""Fill-mask answers in the terms and shapes of transformers' ``FillMaskPipeline``: the top k tokens for
each [MASK], optionally among given targets, shaped per input as the pipeline returns them."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Encoding

from app.errors import InternalError, ValidationFailed
from app.layers import top_k as top_k_of
from app.model.tokenizer import TextTokenizer
from app.options import Names
from app.windows import TOO_LONG_MASKS, check_length

# Each [MASK] holds a probability row over the vocabulary (bert-base-chinese: 21128 floats, 84 kB) until
# its request is answered, and costs top_k decodes on the event loop; this keeps one request near 10 MB.
MAX_MASKS_PER_REQUEST = 128

# One candidate: {"score", "token", "token_str", "sequence"}.
Candidate = dict[str, Any]


def masked(
    encodings: list[Encoding], mask_id: int, limit: int, names: Names
) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
    """Each input's token ids and the positions of its [MASK] tokens.

    Raises:
        ValidationFailed: an input over ``limit`` tokens (fill-mask cannot truncate) or without [MASK];
            more than :data:`MAX_MASKS_PER_REQUEST` masks in all.
    """
    sequences: list[np.ndarray] = []
    positions: list[tuple[int, ...]] = []
    masks = 0
    for i, enc in enumerate(encodings):
        ids = np.asarray(enc.ids, dtype=np.int64)
        check_length(names.item(i), len(ids), limit, TOO_LONG_MASKS)
        where = tuple(int(p) for p in np.flatnonzero(ids == mask_id))
        if not where:
            raise ValidationFailed(f"{names.item(i)} has no [MASK] token")
        masks += len(where)
        if masks > MAX_MASKS_PER_REQUEST:
            raise ValidationFailed(
                f"inputs[:{i + 1}] hold {masks} [MASK] tokens; the limit is {MAX_MASKS_PER_REQUEST} per request"
            )
        sequences.append(ids)
        positions.append(where)
    return sequences, positions


def check_targets(targets: list[str] | None, max_chars: int) -> None:
    """Targets that are not tokens are tokenised like inputs, so they are bounded like inputs.

    Raises:
        ValidationFailed: a target over ``max_chars`` characters.
    """
    for i, target in enumerate(targets or ()):
        if len(target) > max_chars:
            raise ValidationFailed(
                f"parameters.targets[{i}] has {len(target)} characters; the limit is {max_chars}"
            )


def predictions(
    tokenizer: TextTokenizer,
    ids: np.ndarray,
    positions: tuple[int, ...],
    probs: np.ndarray,
    top_k: int,
    targets: np.ndarray | None = None,
) -> list[list[Candidate]]:
    """For each masked position of ``ids`` (one [vocab] row of ``probs`` each), the ``top_k`` fills.

    With ``targets`` (token ids, as :func:`target_ids` gives them) only those compete, each scored by
    its probability over the whole vocabulary, as the pipeline's ``probs[..., target_ids]``; ``top_k``
    is then capped at their number.
    """
    single = len(positions) == 1
    out = []
    for position, row in zip(positions, probs, strict=True):
        if targets is None:
            tokens, scores = top_k_of(row, top_k)
        else:
            picked, scores = top_k_of(row[targets], top_k)
            tokens = targets[picked].tolist()
        filled_in = []
        for token, score in zip(tokens, scores, strict=True):
            filled = ids.copy()
            filled[position] = token
            filled_in.append(
                {
                    "score": score,
                    "token": token,
                    "token_str": tokenizer.decode([token], skip_special_tokens=False),
                    # Like the HF pipeline: with several masks the others stay visible.
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=single),
                }
            )
        out.append(filled_in)
    return out


def answers(
    tokenizer: TextTokenizer,
    sequences: list[np.ndarray],
    positions: list[tuple[int, ...]],
    probs: list[np.ndarray | None],
    top_k: int,
    targets: np.ndarray | None,
) -> list[list[list[Candidate]]]:
    """Per input (its ids, mask positions and their probability rows), per [MASK], its candidates.

    Raises:
        InternalError: an input came back without its probabilities.
    """
    out = []
    for ids, where, rows in zip(sequences, positions, probs, strict=True):
        if rows is None:
            raise InternalError("a fill-mask sequence came back without its mask probabilities")
        out.append(predictions(tokenizer, ids, where, rows, top_k, targets))
    return out


def shaped(answers: list[list[list[Candidate]]], one_text: bool) -> list[Any]:
    """The pipeline's shapes for ``answers`` (per input, per [MASK], its candidates).

    One input's answer is its candidates for one [MASK], or one list of candidates per mask for several.
    ``one_text`` (the request sent a string): that answer alone; a list of inputs: one answer per input.
    Unlike the pipeline, a list of ONE input still answers a list of one answer, so that a client that
    sends lists always reads lists back.
    """
    per_input = [masks[0] if len(masks) == 1 else masks for masks in answers]
    return per_input[0] if one_text else per_input


def split_targets(tokenizer: TextTokenizer, targets: list[str]) -> tuple[list[int], list[str]]:
    """The ids of the ``targets`` that are vocabulary tokens, and the others, still to be tokenised."""
    known: list[int] = []
    unknown: list[str] = []
    for target in targets:
        token = tokenizer.token_to_id(target)
        if token is None:
            unknown.append(target)
        else:
            known.append(token)
    return known, unknown


def target_ids(known: list[int], tokenized: list[list[int]]) -> np.ndarray:
    """The pipeline's ``get_target_ids``: the vocabulary ids ``known``, and of each other target (its
    ids ``tokenized`` without special tokens) the first token, a target without tokens being ignored.
    Distinct and sorted (the pipeline's ``set`` leaves the order to hashing; only ties could tell).

    Raises:
        ValidationFailed: no target is left.
    """
    ids = known + [t[0] for t in tokenized if t]
    if not ids:
        raise ValidationFailed(
            "none of the targets is a vocabulary token or has any token once tokenised (e.g. only "
            "whitespace); give at least one target the model can predict"
        )
    return np.unique(np.asarray(ids, dtype=np.int64))
