"""Per-request arithmetic on pooled vectors and token rows, in numpy: layers combined, a long input's
windows averaged by their tokens, rows normalised, fill-mask's top k."""

from __future__ import annotations

import numpy as np

from app.errors import InternalError
from app.tasks.options import LayerMix


def combine_layers(stack: np.ndarray, mix: LayerMix) -> np.ndarray:
    """Combine the first axis (layers) of ``stack``: [layers, …, hidden] → […, width]."""
    if len(stack) == 1 and mix.how in ("concat", "mean"):
        return stack[0]  # one layer (a default /embed): the same numbers, without a copy (x / 1 is x)
    if mix.how == "concat":
        return np.concatenate(list(stack), axis=-1)
    if mix.how == "mean":
        return stack.mean(axis=0)
    if mix.how == "difference":
        if stack.shape[0] != 2:
            raise InternalError(f"difference of {stack.shape[0]} layers; validation lets only 2 through")
        return stack[0] - stack[1]
    if mix.weights is None or len(mix.weights) != stack.shape[0]:
        raise InternalError("weighted combination without one weight per layer")
    return np.tensordot(np.asarray(mix.weights, dtype=stack.dtype), stack, axes=1)


def row_norms(rows: np.ndarray) -> np.ndarray:
    """Each row's L2 norm: ``np.linalg.norm(rows, axis=-1)``'s bytes without its checks and dispatch,
    which cost more than the sums at one vector (``python -m loadtest.answer_path``)."""
    return np.sqrt(np.add.reduce(rows * rows, axis=-1))


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = row_norms(rows)
    norms[~(norms > 0)] = 1  # what np.where(norms > 0, norms, 1) gives, in place
    return rows / norms[:, None]


def top_k(probs: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    k = min(k, probs.shape[-1])
    idx = np.argpartition(-probs, k - 1)[:k]
    idx = idx[np.argsort(-probs[idx], kind="stable")]
    return idx.tolist(), probs[idx].astype(float).tolist()


# A long input's windows: (owners, tokens), sequence i belonging to input owners[i] with tokens[i] tokens.
Windows = tuple[np.ndarray, np.ndarray]


def input_vectors(
    count: int, pooled: np.ndarray, mix: LayerMix, normalized: bool, windows: Windows | None = None
) -> np.ndarray:
    """[count, width] from ``pooled`` [sequences, layers, hidden]: one sequence per input, or its windows
    (``windows``), averaged by their tokens; whole-array operations, whatever the number of inputs."""
    combined = combine_layers(pooled.transpose(1, 0, 2), mix)  # [sequences, width]
    if windows is not None:
        owners, tokens = windows
        w = tokens.astype(np.float32)
        sums = np.zeros((count, combined.shape[-1]), dtype=np.float32)
        np.add.at(sums, owners, combined * w[:, None])
        combined = sums / np.bincount(owners, weights=w, minlength=count).astype(np.float32)[:, None]
    return normalize_rows(combined) if normalized else combined


def first_components(vectors: np.ndarray, dimensions: int, normalized: bool) -> np.ndarray:
    """Each vector's first ``dimensions`` components (Matryoshka), normalised again if ``normalized``: as
    from the raw vector, so a cache of normalised vectors serves every ``dimensions``."""
    cut = vectors[:, :dimensions]
    return normalize_rows(cut) if normalized else np.ascontiguousarray(cut)  # contiguous for the writers
