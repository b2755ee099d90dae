"""Per-request layer arithmetic on pooled vectors and token rows, in numpy.

:func:`combine_layers` applies a :class:`~app.options.LayerMix` (concat, mean, weighted, difference: the same
arithmetic for pooled vectors and for token rows); a long input's windows are averaged weighted by their
tokens; vectors and rows are normalised; fill-mask takes the top k of a probability row.
"""

from __future__ import annotations

import numpy as np

from app.engine.work import ItemResult
from app.errors import InternalError
from app.options import LayerMix


def combine_layers(stack: np.ndarray, mix: LayerMix) -> np.ndarray:
    """Combine the first axis (layers) of ``stack``: [layers, …, hidden] → […, width].

    concat: the layers side by side in the requested order (width = layers × hidden); mean; weighted:
    the weighted sum with ``mix.weights``; difference: the first layer minus the second.

    Raises:
        InternalError: a mix that validation should not have let through.
    """
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


def weighted_average(vectors: list[np.ndarray], weights: list[int]) -> np.ndarray:
    """Average of a long input's window vectors, each weighted by its number of tokens."""
    if len(vectors) == 1:
        return vectors[0]
    w = np.asarray(weights, dtype=np.float32)
    return (np.stack(vectors) * w[:, None]).sum(axis=0) / w.sum()


def normalize(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def row_norms(rows: np.ndarray) -> np.ndarray:
    """[tokens, width] → [tokens]: each row's L2 norm."""
    return np.linalg.norm(rows, axis=-1)


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    """Each row of [tokens, width] scaled to unit length (a zero row stays zero)."""
    norms = row_norms(rows)[:, None]
    return rows / np.where(norms > 0, norms, 1)


def top_k(probs: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most probable ids of one [vocab] row, most probable first."""
    k = min(k, probs.shape[-1])
    idx = np.argpartition(-probs, k - 1)[:k]
    idx = idx[np.argsort(-probs[idx], kind="stable")]
    return idx.tolist(), probs[idx].astype(float).tolist()


def input_vectors(
    count: int,
    owners: list[int],
    weights: list[int],
    results: list[ItemResult],
    mix: LayerMix,
    normalized: bool,
) -> list[np.ndarray]:
    """One vector for each of ``count`` inputs from the pooled results of their items (windows).

    Item ``i`` belongs to input ``owners[i]`` and carries ``weights[i]`` tokens; an input's window
    vectors are combined by ``mix`` and averaged weighted by tokens, then normalised if asked.

    Raises:
        InternalError: an item came back without its pooled vectors.
    """
    per_input: list[list[np.ndarray]] = [[] for _ in range(count)]
    tokens: list[list[int]] = [[] for _ in range(count)]
    for owner, weight, result in zip(owners, weights, results, strict=True):
        if result.vectors is None:
            raise InternalError("an /embed item came back without its pooled vectors")
        per_input[owner].append(combine_layers(result.vectors, mix))
        tokens[owner].append(weight)
    vectors = [weighted_average(v, w) for v, w in zip(per_input, tokens, strict=True)]
    return [normalize(v) for v in vectors] if normalized else vectors
