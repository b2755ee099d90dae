"""Fill-mask (``/fill-mask``): the top k tokens for each [MASK], optionally among given targets, in the
terms and shapes of transformers' ``FillMaskPipeline``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from app.engine.work import Need
from app.errors import InternalError, Unsupported, ValidationFailed
from app.model.tokenizer import TextTokenizer
from app.tasks.answers import Answer, timed, timings_of
from app.tasks.core import Task
from app.tasks.fill_text import MaskTexts, WholeDecodes, mask_texts
from app.tasks.layers import top_k as top_k_of
from app.tasks.options import Names, listed
from app.tasks.prepare import TOO_LONG_MASKS, Prepared, from_encodings

# Each [MASK] holds a probability row over the vocabulary (bert-base-chinese: 21128 floats, 84 kB) until
# its request is answered; this keeps one request near 10 MB (and its answer near 6,400 candidates).
MAX_MASKS_PER_REQUEST = 128

Candidate = dict[str, Any]  # {"score", "token", "token_str", "sequence"}


def masked(prepared: Prepared, mask_id: int, names: Names) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
    """Each input's token ids and the positions of its [MASK] tokens, checked in input order."""
    positions: list[tuple[int, ...]] = []
    masks = 0
    for i in range(len(prepared.lengths)):
        if i in prepared.problems:
            raise prepared.problems[i]
        # Every input before it is good: none was left out.
        where = tuple(np.flatnonzero(prepared.ids[i] == mask_id).tolist())
        if not where:
            raise ValidationFailed(f"{names.item(i)} has no [MASK] token")
        masks += len(where)
        if masks > MAX_MASKS_PER_REQUEST:
            raise ValidationFailed(
                f"inputs[:{i + 1}] hold {masks} [MASK] tokens; the limit is {MAX_MASKS_PER_REQUEST} per request"
            )
        positions.append(where)
    return prepared.ids, positions


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

    ``targets`` (token ids) alone compete, each scored by its probability over the whole vocabulary, as
    the pipeline's ``probs[..., target_ids]``. ``writers``: a request's text writers, by ``skip_special``.
    """
    skip_special = len(positions) == 1  # like the HF pipeline: with several masks the others stay visible
    texts = (writers or {}).get(skip_special) or mask_texts(tokenizer, skip_special)
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
    """Per input (ids, mask positions, probability rows), per [MASK], its candidates; writers built once."""
    out = []
    writers = {skip: mask_texts(tokenizer, skip) for skip in {len(where) == 1 for where in positions}}
    for ids, where, rows in zip(sequences, positions, probs, strict=True):
        if rows is None:
            raise InternalError("a fill-mask sequence came back without its mask probabilities")
        out.append(predictions(tokenizer, ids, where, rows, top_k, targets, writers))
    return out


def shaped(answers: list[list[list[Candidate]]], one_text: bool) -> list[Any]:
    """The pipeline's shapes: per input, its one [MASK]'s candidates or a list per mask; a string's
    answer alone. Unlike the pipeline, a list of ONE input answers a list, so lists always read lists."""
    per_input = [masks[0] if len(masks) == 1 else masks for masks in answers]
    return per_input[0] if one_text else per_input


def split_targets(tokenizer: TextTokenizer, targets: list[str]) -> tuple[list[int], list[str]]:
    """The ids of the ``targets`` that are vocabulary tokens, and the others, still to be tokenised."""
    ids = [tokenizer.token_to_id(target) for target in targets]
    return [i for i in ids if i is not None], [t for t, i in zip(targets, ids, strict=True) if i is None]


def target_ids(known: list[int], tokenized: list[list[int]]) -> np.ndarray:
    """The pipeline's ``get_target_ids``: the ``known`` ids and each other target's first token (none:
    ignored). Sorted: the pipeline's ``set`` leaves the order to hashing; only ties could tell."""
    ids = known + [t[0] for t in tokenized if t]
    if not ids:
        raise ValidationFailed(
            "none of the targets is a vocabulary token or has any token once tokenised (e.g. only "
            "whitespace); give at least one target the model can predict"
        )
    return np.unique(np.asarray(ids, dtype=np.int64))


class FillMask(Task):
    @timed
    async def fill(
        self, inputs: str | list[str], top_k: int, targets: list[str] | None = None
    ) -> Answer[list[Any]]:
        """The ``top_k`` predictions for each [MASK] (among ``targets``, as the pipeline's, if given)."""
        self.core.check_ready()
        if not self.core.model.has_mlm_head:
            raise Unsupported("this model has no masked-LM head, so it cannot fill masks")
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        max_chars = self.core.settings.max_input_chars
        for i, target in enumerate(targets or ()):  # tokenised like inputs, so bounded like them
            if len(target) > max_chars:
                raise ValidationFailed(
                    f"parameters.targets[{i}] has {len(target)} characters; the limit is {max_chars}"
                )
        mask_id = self.core.model.manifest.tokenizer.mask_id
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.engine.tokenize(texts, offsets=False)
            # Fill-mask runs an input without tokens to refuse it for having no [MASK].
            rules = self.core.rules(TOO_LONG_MASKS, refuse_empty=False)
            sequences, positions = masked(from_encodings(encodings, rules, names.item), mask_id, names)
            candidates = None
            if targets is not None:
                known, unknown = split_targets(self.core.model.tokenizer, targets)
                tokenized: list[list[int]] = []
                if unknown:  # the targets that are not vocabulary tokens
                    parts, target_ms = await self.core.engine.tokenize(
                        unknown, add_special_tokens=False, offsets=False
                    )
                    tokenization_ms += target_ms
                    tokenized = [e.ids for e in parts]
                candidates = target_ids(known, tokenized)
            job = await self.core.run(sequences, [Need(mask_positions=p) for p in positions])
        # Off the event loop: 128 masks × top_k 50 are 6,400 candidates, tens of milliseconds of Python.
        answer = await asyncio.to_thread(
            answers, self.core.model.tokenizer, sequences, positions, job.mask_probs, top_k, candidates
        )
        return Answer(shaped(answer, one_text=isinstance(inputs, str)), timings_of([job], tokenization_ms))
