"""Stage 5, post-processing in numpy.

Per batch (on the post-processing thread, so the inference thread goes straight on to the next batch):
pooling of the layers each item asked for, the unpadded token rows of items that want every token
(/embed_all), and masked-LM probabilities. Per request (called by the service): layer combination
(:class:`LayerMix`: concat, mean, weighted, difference — the same arithmetic for pooled vectors and for
token rows), the token-weighted average of a long input's windows, normalisation, encodings and top-k.
"""

from __future__ import annotations

import base64
import logging
import math
import queue
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.engine.work import ItemResult, WorkItem
from app.errors import InternalError, ValidationFailed
from app.model.manifest import POOLER_OUTPUT

log = logging.getLogger(__name__)

LayerCombine = Literal["concat", "mean", "weighted", "difference"]
Encoding = Literal["float", "base64", "int8"]


# --- per batch ------------------------------------------------------------------------------------


def cls_pool(hidden: np.ndarray) -> np.ndarray:
    """[batch, seq, hidden] → [batch, hidden]: the [CLS] token's state."""
    return hidden[:, 0, :]


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[batch, seq, hidden] → [batch, hidden]: mean over real tokens ([CLS] and [SEP] included)."""
    mask = attention_mask.astype(np.float32)
    summed = np.einsum("bsh,bs->bh", hidden, mask)
    return summed / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


@dataclass
class FinishedBatch:
    """What the inference stage hands over: the items, their padded mask and the fetched outputs."""

    items: list[WorkItem]
    attention_mask: np.ndarray
    outputs: dict[str, np.ndarray]
    # item index → rows of mask_probs_rows that belong to it
    mask_rows: dict[int, slice]
    mask_logits: np.ndarray | None
    output_names: dict[int, str]  # 1-based layer → encoder output name
    started_at: float
    finished_at: float


def split_batch(batch: FinishedBatch) -> list[ItemResult]:
    """Turn one finished batch into one result per item: pooled vectors per requested layer and/or the
    probability rows of its masked positions."""
    pooled: dict[tuple[str, str], np.ndarray] = {}

    def pool(name: str, mode: str) -> np.ndarray:
        key = (name, mode)
        if key not in pooled:
            hidden = batch.outputs[name]
            pooled[key] = cls_pool(hidden) if mode == "cls" else mean_pool(hidden, batch.attention_mask)
        return pooled[key]

    probs = softmax(batch.mask_logits) if batch.mask_logits is not None else None
    results = []
    for i, item in enumerate(batch.items):
        vectors = None
        need = item.need
        if need.pooling == "pooler":
            vectors = batch.outputs[POOLER_OUTPUT][i : i + 1].copy()
        elif need.pooling is not None:
            vectors = np.stack([pool(batch.output_names[layer], need.pooling)[i] for layer in need.layers])
        token_states = None
        if need.tokens:
            # Rows [0, length) are the item's own tokens; the rest of the padded row is never read.
            token_states = np.stack(
                [batch.outputs[batch.output_names[layer]][i, : item.length] for layer in need.layers]
            )
        mask_probs = None
        if need.mask_positions:
            if probs is None:
                raise InternalError("an item asked for masked positions but the batch ran no MLM head")
            mask_probs = probs[batch.mask_rows[i]]
        results.append(
            ItemResult(
                vectors=vectors,
                mask_probs=mask_probs,
                queued_s=batch.started_at - item.enqueued_at,
                inference_s=batch.finished_at - batch.started_at,
                batch_started=batch.started_at,
                batch_size=len(batch.items),
                token_states=token_states,
            )
        )
    return results


class PostProcessing:
    """The post-processing thread: splits finished batches and resolves each item's future."""

    def __init__(self, capacity: int = 2) -> None:
        # Small bound: if this stage falls behind, the inference thread waits instead of piling up.
        self._batches: queue.Queue[FinishedBatch | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="zhembed-postprocess", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._batches.put(None)
        self._thread.join(timeout=10)

    def put(self, batch: FinishedBatch) -> None:
        self._batches.put(batch)

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                results = split_batch(batch)
            except Exception as exc:  # a broken invariant: fail these requests loudly, keep serving
                log.exception("post-processing failed for a batch of %d", len(batch.items))
                for item in batch.items:
                    item.fail(InternalError(f"post-processing failed: {exc}"))
                continue
            for item, result in zip(batch.items, results, strict=True):
                item.resolve(result)


# --- per request ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerMix:
    """How an item's layers combine into one vector (per token, for /embed_all).

    ``weights`` (``weighted`` only) are one per layer, in the order of the layers, and sum to 1.
    """

    how: LayerCombine = "concat"
    weights: tuple[float, ...] | None = None


def layer_mix(how: LayerCombine, layers: int, weights: tuple[float, ...] | None) -> LayerMix:
    """Check that ``how`` and ``weights`` fit ``layers`` layers; normalise the weights to sum 1.

    Raises:
        ValidationFailed: weights given without ``weighted`` or missing with it, not one per layer,
            negative, not finite or all zero; ``difference`` with other than two layers.
    """
    if how != "weighted":
        if weights is not None:
            raise ValidationFailed(
                f"layer_weights go with layer_combine 'weighted' only (layer_combine is '{how}')"
            )
        if how == "difference" and layers != 2:
            raise ValidationFailed(
                f"layer_combine 'difference' takes exactly two layers (the first minus the second), "
                f"got {layers}: send layers [a, b]"
            )
        return LayerMix(how)
    if weights is None:
        raise ValidationFailed(
            f"layer_combine 'weighted' needs layer_weights: one weight per layer ({layers} here)"
        )
    if len(weights) != layers:
        raise ValidationFailed(
            f"layer_weights has {len(weights)} weights for {layers} layers: give one weight per layer, "
            "in the order of layers"
        )
    for i, w in enumerate(weights):
        if not math.isfinite(w):
            raise ValidationFailed(f"layer_weights[{i}] is {w}: weights must be finite numbers ≥ 0")
        if w < 0:
            raise ValidationFailed(f"layer_weights[{i}] is {w}: weights must be ≥ 0")
    peak = max(weights)
    if peak == 0:
        raise ValidationFailed(
            "layer_weights are all 0: at least one must be positive (they are scaled to sum 1)"
        )
    scaled = [w / peak for w in weights]  # first to at most 1, so the sum cannot overflow
    total = sum(scaled)
    return LayerMix(how, tuple(w / total for w in scaled))


def combine_layers(stack: np.ndarray, mix: LayerMix) -> np.ndarray:
    """Combine the first axis (layers) of ``stack``: [layers, …, hidden] → […, width].

    concat: the layers side by side in the requested order (width = layers × hidden); mean; weighted:
    the weighted sum with ``mix.weights``; difference: the first layer minus the second.
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


def encode_vector(vector: np.ndarray, encoding: Encoding) -> np.ndarray | str | dict[str, object]:
    """One vector in the requested encoding, ready for ``orjson`` with ``OPT_SERIALIZE_NUMPY``.

    - ``float``: the float32 array; it is written as a list of numbers, each in the shortest form that
      reads back as the same float32 (``0.1``, not ``0.10000000149011612``: about 40% fewer bytes).
    - ``base64``: the little-endian float32 bytes, base64-encoded.
    - ``int8``: ``{"values": [int in -127..127], "scale": float}``; the vector is ``values × scale``
      (symmetric per-vector quantisation, scale = max |x| / 127).
    """
    v = np.ascontiguousarray(vector, dtype=np.float32)
    if encoding == "float":
        return v
    if encoding == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    peak = float(np.abs(v).max()) if v.size else 0.0
    scale = peak / 127 if peak > 0 else 1.0
    values = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
    return {"values": values, "scale": scale}


def encode_rows(rows: np.ndarray, encoding: Literal["float", "base64"]) -> np.ndarray | list[Any]:
    """Each row of [tokens, width] in the requested encoding (see :func:`encode_vector`)."""
    if encoding == "float":
        return np.ascontiguousarray(rows, dtype=np.float32)  # written as a list of lists
    return [encode_vector(row, encoding) for row in rows]


def top_k(probs: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most probable ids of one [vocab] row, most probable first."""
    k = min(k, probs.shape[-1])
    idx = np.argpartition(-probs, k - 1)[:k]
    idx = idx[np.argsort(-probs[idx], kind="stable")]
    return idx.tolist(), probs[idx].astype(float).tolist()
