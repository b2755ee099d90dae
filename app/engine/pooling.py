"""Pooling: how a sequence's token states become one vector. The vocabulary, its meaning and its code.

Adding a pooling mode touches this module (and its test) only: add it to :data:`Pooling`, give
:data:`POOLERS` its function and :data:`DESCRIPTIONS` its line; the API schema, the options and the
post-processing stage read them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import numpy as np

# "pooler" is BERT's pooler output: a graph output of its own (last layer only), not a function of the
# token states, so it has no entry in POOLERS.
Pooling = Literal["cls", "mean", "pooler"]
POOLER: Literal["pooler"] = "pooler"


def cls_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[batch, seq, hidden] → [batch, hidden]: the [CLS] token's state."""
    return hidden[:, 0, :]


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[batch, seq, hidden] → [batch, hidden]: mean over real tokens ([CLS] and [SEP] included)."""
    mask = attention_mask.astype(np.float32)
    summed = np.einsum("bsh,bs->bh", hidden, mask)
    return summed / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)


# Mode → function of (padded token states [batch, seq, hidden], attention mask [batch, seq]).
POOLERS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {"cls": cls_pool, "mean": mean_pool}

DESCRIPTIONS: dict[str, str] = {
    "cls": "the [CLS] state",
    "mean": "mean over tokens ([CLS]/[SEP] included)",
    "pooler": "BERT's pooler output (last layer only)",
}

if set(POOLERS) | {POOLER} != set(get_args(Pooling)) or set(DESCRIPTIONS) != set(get_args(Pooling)):
    raise RuntimeError("every pooling mode needs a function in POOLERS (but pooler) and a description")


def pool(mode: str, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Pool a padded batch of token states with ``mode``.

    Raises:
        KeyError: ``mode`` has no pooling function (validation lets only known modes through).
    """
    return POOLERS[mode](hidden, attention_mask)


def describe() -> str:
    """One line per mode, for the API docs."""
    return "; ".join(f"{mode}: {text}" for mode, text in DESCRIPTIONS.items()) + "."
