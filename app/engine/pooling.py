"""Pooling: token states [batch, seq, hidden] and their mask [batch, seq] to [batch, hidden], over the
unmasked tokens. A new mode is this module's change only (:data:`Pooling`, POOLERS and DESCRIPTIONS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import numpy as np

# "pooler" is BERT's pooler output: a graph output of its own (last layer only), not a function of the
# token states, so it has no entry in POOLERS. The other modes are sentence-transformers' (its Pooling
# module's names, but mean_sqrt_len_tokens): a folder that pools with one of them gets it by default.
Pooling = Literal["cls", "mean", "pooler", "max", "mean_sqrt_len", "weightedmean", "lasttoken"]
POOLER: Literal["pooler"] = "pooler"


def cls_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The first unmasked token's state, as sentence-transformers takes it when a prompt is masked out."""
    if attention_mask[:, 0].all():
        return hidden[:, 0, :]
    return hidden[np.arange(hidden.shape[0]), attention_mask.argmax(axis=1)]


def _mean(hidden: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.einsum("bsh,bs->bh", hidden, weights) / np.maximum(weights.sum(axis=1, keepdims=True), 1.0)


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    return _mean(hidden, attention_mask.astype(np.float32))


def mean_sqrt_len_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    mask = attention_mask.astype(np.float32)
    return np.einsum("bsh,bs->bh", hidden, mask) / np.sqrt(np.maximum(mask.sum(axis=1, keepdims=True), 1.0))


def max_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    return np.where(attention_mask[:, :, None].astype(bool), hidden, -np.inf).max(axis=1).astype(np.float32)


def weightedmean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    weights = attention_mask.astype(np.float32) * np.arange(1, attention_mask.shape[1] + 1, dtype=np.float32)
    return _mean(hidden, weights)


def lasttoken_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    last = attention_mask.shape[1] - 1 - attention_mask[:, ::-1].argmax(axis=1)
    return hidden[np.arange(hidden.shape[0]), last]


POOLERS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "cls": cls_pool,
    "mean": mean_pool,
    "max": max_pool,
    "mean_sqrt_len": mean_sqrt_len_pool,
    "weightedmean": weightedmean_pool,
    "lasttoken": lasttoken_pool,
}

DESCRIPTIONS: dict[str, str] = {
    "cls": "the [CLS] state",
    "mean": "mean over tokens ([CLS]/[SEP] included)",
    "pooler": "BERT's pooler output (last layer only)",
    "max": "each dimension's maximum over tokens",
    "mean_sqrt_len": "sum over tokens divided by the square root of their number",
    "weightedmean": "mean over tokens weighted by position (1, 2, ...)",
    "lasttoken": "the last token's state ([SEP])",
}

if set(POOLERS) | {POOLER} != set(get_args(Pooling)) or set(DESCRIPTIONS) != set(get_args(Pooling)):
    raise RuntimeError("every pooling mode needs a function in POOLERS (but pooler) and a description")


def pool(mode: str, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Raises KeyError where ``mode`` has no function (validation lets only known modes through)."""
    return POOLERS[mode](hidden, attention_mask)


def describe() -> str:
    return (
        "Default: the model's (its sentence-transformers Pooling, else mean). "
        + "; ".join(f"{mode}: {text}" for mode, text in DESCRIPTIONS.items())
        + "."
    )
