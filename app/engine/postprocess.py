"""Stage 5, post-processing in numpy.

Per batch (on the post-processing thread, so the inference thread goes straight on to the next batch):
pooling of the layers each item asked for, and masked-LM probabilities. Per request (called by the
service): layer combination, the token-weighted average of a long input's windows, normalisation,
encodings and top-k.
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.engine.work import ItemResult, WorkItem
from app.errors import InternalError
from app.model.manifest import POOLER_OUTPUT

log = logging.getLogger(__name__)

LayerCombine = Literal["concat", "mean"]
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


def combine_layers(vectors: np.ndarray, how: LayerCombine) -> np.ndarray:
    """[layers, hidden] → [hidden] (mean) or [layers × hidden] (concat, in the requested order)."""
    return vectors.reshape(-1) if how == "concat" else vectors.mean(axis=0)


def weighted_average(vectors: list[np.ndarray], weights: list[int]) -> np.ndarray:
    """Average of a long input's window vectors, each weighted by its number of tokens."""
    if len(vectors) == 1:
        return vectors[0]
    w = np.asarray(weights, dtype=np.float32)
    return (np.stack(vectors) * w[:, None]).sum(axis=0) / w.sum()


def normalize(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def encode_vector(vector: np.ndarray, encoding: Encoding) -> list[float] | str | dict[str, object]:
    """One vector in the requested encoding.

    - ``float``: a list of numbers.
    - ``base64``: the little-endian float32 bytes, base64-encoded.
    - ``int8``: ``{"values": [int in -127..127], "scale": float}``; the vector is ``values × scale``
      (symmetric per-vector quantisation, scale = max |x| / 127).
    """
    v = np.asarray(vector, dtype=np.float32)
    if encoding == "float":
        return v.tolist()
    if encoding == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    peak = float(np.abs(v).max()) if v.size else 0.0
    scale = peak / 127 if peak > 0 else 1.0
    values = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
    return {"values": values.tolist(), "scale": scale}


def top_k(probs: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most probable ids of one [vocab] row, most probable first."""
    k = min(k, probs.shape[-1])
    idx = np.argpartition(-probs, k - 1)[:k]
    idx = idx[np.argsort(-probs[idx], kind="stable")]
    return idx.tolist(), probs[idx].astype(float).tolist()
