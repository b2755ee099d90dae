"""Long inputs: the windows a tokenised input runs as — itself, its truncation, or its chunks."""

from __future__ import annotations

import numpy as np

from app.errors import ValidationFailed
from app.options import Direction, LongText


def truncated_positions(length: int, limit: int, direction: Direction) -> np.ndarray:
    """Positions a sequence of ``length`` tokens keeps when truncated to ``limit``: [CLS], the first
    (right) or last (left) ``limit - 2`` tokens of its body, and [SEP]."""
    body = limit - 2
    start = 1 if direction == "right" else length - 1 - body
    return np.concatenate([[0], np.arange(start, start + body), [length - 1]])


def windows(
    ids: np.ndarray, limit: int, long_text: LongText, direction: Direction, cls_id: int, sep_id: int
) -> list[np.ndarray]:
    """The sequences of at most ``limit`` tokens that ``ids`` ([CLS] … [SEP]) runs as.

    Short enough: itself. Longer: its truncation (``truncate``), or its body cut into windows of
    ``limit - 2`` tokens, each with its own [CLS] and [SEP] (``chunk``).

    Raises:
        ValueError: ``long_text`` "error" with ``ids`` over ``limit`` (the caller checks first).
    """
    if len(ids) <= limit:
        return [ids]
    if long_text == "truncate":
        return [ids[truncated_positions(len(ids), limit, direction)]]
    if long_text != "chunk":
        raise ValueError(f"{len(ids)} tokens over the limit of {limit} with long_text {long_text!r}")
    per_window = limit - 2  # room for [CLS] and [SEP]
    body = ids[1:-1]
    cls, sep = np.array([cls_id], ids.dtype), np.array([sep_id], ids.dtype)
    return [np.concatenate([cls, body[s : s + per_window], sep]) for s in range(0, len(body), per_window)]


def check_length(name: str, tokens: int, limit: int, remedy: str) -> None:
    """Refuse the input called ``name`` (``inputs[2]``) of ``tokens`` tokens when over the model's
    ``limit``, saying what to do (``remedy``).

    Raises:
        ValidationFailed: over the limit.
    """
    if tokens > limit:
        raise ValidationFailed(f"{name} has {tokens} tokens, over the model's limit of {limit}; {remedy}")
