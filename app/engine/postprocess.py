"""Stage 5, post-processing in numpy, per batch.

On the post-processing thread, so the inference thread goes straight on to the next batch: pooling of the
layers each item asked for (:mod:`app.engine.pooling`), the unpadded token rows of items that want every
token (/embed_all), and masked-LM probabilities. What is done per request with the results (layer
combination, window averages, normalisation) is in :mod:`app.layers`; wire encodings in the API layer.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import numpy as np

from app.engine import pooling
from app.engine.work import ItemResult, WorkItem
from app.errors import InternalError
from app.model.manifest import POOLER_OUTPUT

log = logging.getLogger(__name__)


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
            pooled[key] = pooling.pool(mode, batch.outputs[name], batch.attention_mask)
        return pooled[key]

    probs = softmax(batch.mask_logits) if batch.mask_logits is not None else None
    results = []
    for i, item in enumerate(batch.items):
        vectors = None
        need = item.need
        if need.pooling == pooling.POOLER:
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
