"""Token-id inputs (OpenAI's API and TEI accept them): their forms and the check against the vocabulary.
They run as given, as TEI runs them: [CLS] and [SEP] are the sender's to include."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.errors import ValidationFailed
from app.tasks.options import Names, listed

# Ids from another tokenizer are the usual cause of an id out of range; say so.
FOREIGN_IDS = (
    "ids from another tokenizer mean nothing here (LangChain's OpenAIEmbeddings sends tiktoken's unless "
    "check_embedding_ctx_length=False): send the text, or ids from POST /tokenize"
)


def token_id_lists(
    inputs: str | list[str] | list[int] | list[list[int]],
) -> tuple[list[list[int]], Names] | None:
    """Token-id ``inputs`` (ids, or lists of them) as lists, with their names in errors; None for texts."""
    if not inputs or not isinstance(inputs, list) or isinstance(inputs[0], str):
        return None
    if isinstance(inputs[0], int):
        return [inputs], Names("input", lambda _i: "input")
    return inputs, listed("input", inputs)


def out_of_vocabulary(
    seq: list[int], vocab_size: int, name: Callable[[int], str], i: int
) -> ValidationFailed | None:
    """The refusal of token-id input ``i`` for its first id outside the vocabulary; None if there is none."""
    try:
        ids = np.asarray(seq, dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    except OverflowError:  # past int64: out of range whatever it is
        bad = np.array([next(j for j, t in enumerate(seq) if not -(2**63) <= t < 2**63)])
    if not len(bad):
        return None
    j = int(bad[0])
    return ValidationFailed(
        f"{name(i)}[{j}] is {seq[j]}, not a token id of this model (0..{vocab_size - 1}); " + FOREIGN_IDS
    )
