"""Long inputs: the windows a tokenised input runs as (itself, its truncation, or its chunks) and how a
pair is cut; :mod:`app.tasks.prepare` decides which are cut."""

from __future__ import annotations

import numpy as np

from app.tasks.options import Direction, LongText


def truncated_positions(length: int, limit: int, direction: Direction, keep: int = 1) -> np.ndarray:
    """Positions kept truncating ``length`` tokens to ``limit``: the first ``keep`` ([CLS] and a prompt),
    the first (right) or last (left) of the rest, and [SEP]: ``[CLS] prompt … tail [SEP]``."""
    body = limit - 1 - keep
    start = keep if direction == "right" else length - 1 - body
    return np.concatenate([np.arange(keep), np.arange(start, start + body), [length - 1]])


def truncate_pair(
    ids: np.ndarray, types: np.ndarray, limit: int, direction: Direction
) -> tuple[np.ndarray, np.ndarray]:
    """A pair ``[CLS] a [SEP] b [SEP]`` cut to ``limit`` as tokenizers' ``longest_first`` cuts it: the
    longer text loses tokens until both fit; both over half the room keep half each (b the odd one)."""
    if len(ids) <= limit:
        return ids, types
    first = np.flatnonzero(types == 0)[1:-1]  # a's positions
    second = np.flatnonzero(types == 1)[:-1]  # b's positions
    room = limit - 3
    # The shorter text keeps all its tokens if it fits in half the room, else half; the longer the rest.
    short = min(len(first), len(second))
    n_short = room // 2 if 2 * short >= room else short
    n1, n2 = (room - n_short, n_short) if len(first) > len(second) else (n_short, room - n_short)

    def kept(positions: np.ndarray, n: int) -> np.ndarray:
        return positions[:n] if direction == "right" else positions[max(len(positions) - n, 0) :]

    a, b = kept(first, n1), kept(second, n2)
    last_a = int(np.flatnonzero(types == 0)[-1])
    keep = np.concatenate([[0], a, [last_a], b, [len(ids) - 1]]).astype(np.int64)
    return ids[keep], types[keep]


def windows(
    ids: np.ndarray, limit: int, long_text: LongText, direction: Direction, cls_id: int, sep_id: int
) -> list[np.ndarray]:
    """The sequences of at most ``limit`` tokens ``ids`` ([CLS] … [SEP]) runs as: itself, its truncation,
    or (``chunk``) its body cut into windows of ``limit - 2`` tokens, each with its own [CLS] and [SEP]."""
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
