"""Fill-mask: the top k tokens for each [MASK] (``/fill-mask``), optionally among given targets, in the
terms and shapes of transformers' ``FillMaskPipeline``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from app.engine.work import Need
from app.errors import InternalError, Unsupported, ValidationFailed
from app.model.tokenizer import TextTokenizer
from app.tasks.answers import Answer, timed, timings_of
from app.tasks.core import Core
from app.tasks.fill_text import MaskTexts, WholeDecodes, mask_texts
from app.tasks.layers import top_k as top_k_of
from app.tasks.options import Names, listed
from app.tasks.prepare import TOO_LONG_MASKS, Prepared, from_encodings

# Each [MASK] holds a probability row over the vocabulary (bert-base-chinese: 21128 floats, 84 kB) until
# its request is answered; this keeps one request near 10 MB (and its answer near 6,400 candidates).
MAX_MASKS_PER_REQUEST = 128

# One candidate: {"score", "token", "token_str", "sequence"}.
Candidate = dict[str, Any]


def masked(prepared: Prepared, mask_id: int, names: Names) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
    """Each input's token ids and the positions of its [MASK] tokens, checked in input order.

    Raises:
        ValidationFailed: an input over the model's length (fill-mask cannot truncate: ``prepared``'s
            problem) or without [MASK]; more than :data:`MAX_MASKS_PER_REQUEST` masks in all.
    """
    positions: list[tuple[int, ...]] = []
    masks = 0
    for i in range(len(prepared.lengths)):
        if i in prepared.problems:
            raise prepared.problems[i]
        ids = prepared.ids[i]  # every input before it is good: none was left out
        where = tuple(int(p) for p in np.flatnonzero(ids == mask_id))
        if not where:
            raise ValidationFailed(f"{names.item(i)} has no [MASK] token")
        masks += len(where)
        if masks > MAX_MASKS_PER_REQUEST:
            raise ValidationFailed(
                f"inputs[:{i + 1}] hold {masks} [MASK] tokens; the limit is {MAX_MASKS_PER_REQUEST} per request"
            )
        positions.append(where)
    return prepared.ids, positions


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
    writers: dict[bool, MaskTexts | WholeDecodes] | None = None,
) -> list[list[Candidate]]:
    """For each masked position of ``ids`` (one [vocab] row of ``probs`` each), the ``top_k`` fills.

    With ``targets`` (token ids, as :func:`target_ids` gives them) only those compete, each scored by
    its probability over the whole vocabulary, as the pipeline's ``probs[..., target_ids]``; ``top_k``
    is then capped at their number. ``writers``: the filled-text writers a request's inputs share, by
    ``skip_special`` (built here, and kept there, the first time one is needed).
    """
    # Like the HF pipeline: with several masks the others stay visible.
    skip_special = len(positions) == 1
    writers = {} if writers is None else writers
    texts = writers.get(skip_special)
    if texts is None:
        texts = writers[skip_special] = mask_texts(tokenizer, skip_special)
    listed = ids.tolist()
    token_strs: dict[int, str] = {}
    out = []
    for position, row in zip(positions, probs, strict=True):
        if targets is None:
            tokens, scores = top_k_of(row, top_k)
        else:
            picked, scores = top_k_of(row[targets], top_k)
            tokens = targets[picked].tolist()
        sequences = texts.filled(listed, position, tokens)
        filled_in = []
        for token, score, sequence in zip(tokens, scores, sequences, strict=True):
            token_str = token_strs.get(token)
            if token_str is None:
                token_str = token_strs[token] = tokenizer.decode([token], skip_special_tokens=False)
            filled_in.append({"score": score, "token": token, "token_str": token_str, "sequence": sequence})
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
    writers: dict[bool, MaskTexts | WholeDecodes] = {}  # built once a request, not once an input
    for ids, where, rows in zip(sequences, positions, probs, strict=True):
        if rows is None:
            raise InternalError("a fill-mask sequence came back without its mask probabilities")
        out.append(predictions(tokenizer, ids, where, rows, top_k, targets, writers))
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


class FillMask:
    """The fill-mask task over the shared :class:`~app.tasks.core.Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    @timed
    async def fill(
        self, inputs: str | list[str], top_k: int, targets: list[str] | None = None
    ) -> Answer[list[Any]]:
        """The ``top_k`` predictions for each [MASK], in the shapes of transformers' fill-mask pipeline
        (:func:`shaped`: a string's answer alone, a list's one answer per input).

        ``targets``, as the pipeline's: only these tokens compete (a target that is not a vocabulary
        token stands for its first token), scored by their probability over the whole vocabulary.

        Raises:
            Unsupported: the model has no masked-LM head.
            EmptyInput: no inputs, or an empty one.
            ValidationFailed: an input without [MASK] or over the model's length; more than
                ``MAX_MASKS_PER_REQUEST`` masks; a target over ``max_input_chars``; no target left.
        """
        self.core.check_ready()
        if not self.core.model.has_mlm_head:
            raise Unsupported("this model has no masked-LM head, so it cannot fill masks")
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        check_targets(targets, self.core.settings.max_input_chars)
        mask_id = self.core.model.manifest.tokenizer.mask_id
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.tokenize(texts, offsets=False)
            # Fill-mask runs an input without tokens to refuse it for having no [MASK].
            rules = self.core.rules(TOO_LONG_MASKS, refuse_empty=False)
            sequences, positions = masked(from_encodings(encodings, rules, names.item), mask_id, names)
            needs = [Need(mask_positions=p) for p in positions]
            candidates = None
            if targets is not None:
                candidates, target_ms = await self._target_ids(targets)
                tokenization_ms += target_ms
            job = await self.core.run(sequences, needs)
        # Off the event loop: 128 masks × top_k 50 are 6,400 candidates, tens of milliseconds of Python.
        answer = await asyncio.to_thread(
            answers, self.core.model.tokenizer, sequences, positions, job.mask_probs, top_k, candidates
        )
        return Answer(shaped(answer, one_text=isinstance(inputs, str)), timings_of([job], tokenization_ms))

    async def _target_ids(self, targets: list[str]) -> tuple[np.ndarray, float]:
        """The token ids fill-mask ``targets`` stand for (:func:`target_ids`), and the
        milliseconds spent tokenising those that are not vocabulary tokens (none when all are).
        """
        known, unknown = split_targets(self.core.model.tokenizer, targets)
        tokenized: list[list[int]] = []
        tokenization_ms = 0.0
        if unknown:
            encodings, tokenization_ms = await self.core.tokenize(
                unknown, add_special_tokens=False, offsets=False
            )
            tokenized = [e.ids for e in encodings]
        return target_ids(known, tokenized), tokenization_ms
