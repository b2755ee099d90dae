"""Long inputs: the windows a tokenised input runs as — itself, its truncation, or its chunks — and how a
pair is cut. Which inputs are cut, and which refused, is :mod:`app.tasks.prepare`'s to decide."""

from __future__ import annotations

import numpy as np

from app.tasks.options import Direction, LongText


def truncated_positions(length: int, limit: int, direction: Direction, keep: int = 1) -> np.ndarray:
    """Positions a sequence of ``length`` tokens keeps when truncated to ``limit``: its first ``keep``
    ([CLS], and a prompt's tokens after it), the first (right) or last (left) of the rest of its body,
    as many as fit, and [SEP]. A prompt is kept whichever end is cut: ``[CLS] prompt … tail [SEP]``."""
    body = limit - 1 - keep
    start = keep if direction == "right" else length - 1 - body
    return np.concatenate([np.arange(keep), np.arange(start, start + body), [length - 1]])


def truncate_pair(
    ids: np.ndarray, types: np.ndarray, limit: int, direction: Direction
) -> tuple[np.ndarray, np.ndarray]:
    """A pair ``[CLS] a [SEP] b [SEP]`` (``types`` 0 for [CLS] a [SEP], 1 for b [SEP]) cut to ``limit``
    tokens the way Hugging Face tokenizers' ``longest_first`` does: the longer text loses tokens until
    both fit, and when both are over half the room each keeps half (the second the odd one).
    """
    if len(ids) <= limit:
        return ids, types
    first = np.flatnonzero(types == 0)[1:-1]  # a's positions
    second = np.flatnonzero(types == 1)[:-1]  # b's positions
    room = limit - 3
    n1, n2 = len(first), len(second)
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > room else max(n1, room - n1)
    if n1 + n2 > room:
        n1 = room // 2
        n2 = n1 + room % 2
    if swap:
        n1, n2 = n2, n1

    def kept(positions: np.ndarray, n: int) -> np.ndarray:
        if len(positions) <= n:
            return positions
        return positions[:n] if direction == "right" else positions[len(positions) - n :]

    a, b = kept(first, n1), kept(second, n2)
    last_a = int(np.flatnonzero(types == 0)[-1])
    keep = np.concatenate([[0], a, [last_a], b, [len(ids) - 1]]).astype(np.int64)
    return ids[keep], types[keep]


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
