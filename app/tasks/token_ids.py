"""Token-id inputs (OpenAI's API and TEI accept them): checked against the limits and the vocabulary.

They run as given, as text-embeddings-inference runs them: [CLS] and [SEP] are the sender's to include,
as ``POST /tokenize`` writes them.
"""

from __future__ import annotations

import numpy as np

from app.errors import EmptyInput, ValidationFailed
from app.tasks.options import Names, check_count, listed
from app.tasks.windows import TOO_LONG_OPENAI, check_length

# Ids from another tokenizer are the usual cause of an id out of range; say so.
FOREIGN_IDS = (
    "ids from another tokenizer mean nothing here (LangChain's OpenAIEmbeddings sends tiktoken's unless "
    "check_embedding_ctx_length=False): send the text, or ids from POST /tokenize"
)


def token_id_lists(
    inputs: str | list[str] | list[int] | list[list[int]],
) -> tuple[list[list[int]], Names] | None:
    """Token-id ``inputs`` (one list of ids, or a list of such lists) as a list of lists, with the names
    errors give them (``input``, ``input[2]``); None for texts."""
    if not inputs or not isinstance(inputs, list) or isinstance(inputs[0], str):
        return None
    if isinstance(inputs[0], int):
        return [inputs], Names("input", lambda _i: "input")
    return inputs, listed("input", inputs)


def token_id_inputs(
    sequences: list[list[int]], names: Names, max_inputs: int, max_length: int, vocab_size: int
) -> dict[str, np.ndarray]:
    """Each sequence of ids as an array, under the key the vector cache files it under: its ids
    written out (the cache keeps them apart from texts by its options).

    Raises:
        EmptyInput: no sequences, or an empty one.
        ValidationFailed: more than ``max_inputs`` sequences, one over ``max_length``, an id outside
            0..``vocab_size`` - 1.
    """
    check_count(len(sequences), max_inputs, names)
    given: dict[str, np.ndarray] = {}
    for i, seq in enumerate(sequences):
        if not seq:
            raise EmptyInput(f"{names.item(i)} is empty")
        check_length(names.item(i), len(seq), max_length, TOO_LONG_OPENAI)
        try:
            ids = np.asarray(seq, dtype=np.int64)
            bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        except OverflowError:  # past int64: out of range whatever it is
            bad = np.array([next(j for j, t in enumerate(seq) if not -(2**63) <= t < 2**63)])
        if len(bad):
            j = int(bad[0])
            raise ValidationFailed(
                f"{names.item(i)}[{j}] is {seq[j]}, not a token id of this model (0..{vocab_size - 1}); "
                + FOREIGN_IDS
            )
        given[",".join(map(str, seq))] = ids
    return given
