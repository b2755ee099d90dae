"""Stage 5, post-processing in numpy, per batch, on the inference thread: each job's pooled vectors (the
graph's pooled outputs, else pooled here), token rows (/embed_all), head scores, masked-LM probabilities
and SPLADE vectors. Per-request arithmetic (layers, windows, normalisation) is in :mod:`app.tasks.layers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.engine import pooling
from app.engine.work import Job, Need, Seq
from app.errors import InternalError
from app.model.manifest import HEAD_OUTPUT, POOLER_OUTPUT


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def head_scores(logits: np.ndarray, activation: str) -> np.ndarray:
    """A fine-tuned head's scores by the manifest's ``head.activation`` (``identity``: the logits)."""
    if activation == "softmax":
        return softmax(logits)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    return logits


@dataclass
class FinishedBatch:
    """What the inference stage hands over: the sequences, their padded mask and the fetched outputs."""

    sequences: list[Seq]
    attention_mask: np.ndarray
    outputs: dict[str, np.ndarray]
    mask_rows: dict[int, slice]  # sequence index → its rows of mask_logits
    mask_logits: np.ndarray | None
    sparse: dict[int, int]  # sequence index → its row of sparse_vectors ([k, vocab], of the rows that asked)
    sparse_vectors: np.ndarray | None
    output_names: dict[int, str]  # 1-based layer → encoder output name
    started_at: float  # real time (perf_counter): its duration, the machine's
    finished_at: float
    begun_at: float  # when it started on the engine's clock, what its sequences' queue waits end at
    cpu_s: float = 0.0  # the running thread's CPU seconds inside ONNX Runtime
    # (1-based layer, pooling mode) → the encoder output holding that pooled vector, where the graph has it
    pooled_names: dict[tuple[int, str], str] = field(default_factory=dict)


def split_batch(batch: FinishedBatch) -> list[tuple[Job, int]]:
    """Write one finished batch's results into its jobs, vectors with one array assignment per (job, need);
    returns each job with how many of its sequences were in this batch (the caller counts them done)."""
    pooled: dict[tuple[int, str, int], np.ndarray] = {}

    def pool(layer: int, mode: str, skip: int) -> np.ndarray:
        key = (layer, mode, skip)
        if key not in pooled:
            name = batch.pooled_names.get((layer, mode))
            if not skip and name is not None and name in batch.outputs:
                pooled[key] = batch.outputs[name]
            else:
                mask = batch.attention_mask
                if skip:  # positions before ``skip`` (a prompt) are left out, as sentence-transformers does
                    mask = mask.copy()
                    mask[:, :skip] = 0
                pooled[key] = pooling.pool(mode, batch.outputs[batch.output_names[layer]], mask)
        return pooled[key]

    probs = softmax(batch.mask_logits) if batch.mask_logits is not None else None
    inference_s = batch.finished_at - batch.started_at
    # (job, need) → the batch rows and job slots of its sequences here
    groups: dict[tuple[int, int], tuple[Job, Need, list[int], list[int]]] = {}
    for row, seq in enumerate(batch.sequences):
        group = groups.get((id(seq.job), id(seq.need)))
        if group is None:
            group = groups[(id(seq.job), id(seq.need))] = (seq.job, seq.need, [], [])
        group[2].append(row)
        group[3].append(seq.slot)
    done: dict[int, tuple[Job, int]] = {}
    for job, need, rows, slots in groups.values():
        if need.pooling == pooling.POOLER:
            _store_vectors(job, slots, batch.outputs[POOLER_OUTPUT][rows][:, None, :])
        elif need.pooling is not None:
            per_layer = [pool(layer, need.pooling, need.pool_from)[rows] for layer in need.layers]
            # One layer (a default /embed): a view with the layer axis, not np.stack's copy of the copy.
            stacked = per_layer[0][:, None, :] if len(per_layer) == 1 else np.stack(per_layer, axis=1)
            _store_vectors(job, slots, stacked)
        if need.head:
            logits = batch.outputs[HEAD_OUTPUT]
            if logits.ndim == 2:  # one row per sequence: a classifier or a reranker
                _store_vectors(job, slots, logits[rows][:, None, :])
            else:  # one row per token: a tagger
                job.token_states = job.token_states or [None] * job.count
                for row, slot in zip(rows, slots, strict=True):
                    job.token_states[slot] = logits[row, None, : batch.sequences[row].length]
        if need.sparse:
            if batch.sparse_vectors is None:
                raise InternalError("a sequence asked for a sparse vector but the batch ran no sparse graph")
            _store_vectors(job, slots, batch.sparse_vectors[[batch.sparse[row] for row in rows]][:, None, :])
        if need.tokens:
            job.token_states = job.token_states or [None] * job.count
            for row, slot in zip(rows, slots, strict=True):
                # Rows [0, length) are the sequence's own tokens; the rest of the padded row is never read.
                length = batch.sequences[row].length
                job.token_states[slot] = np.stack(
                    [batch.outputs[batch.output_names[layer]][row, :length] for layer in need.layers]
                )
        if need.mask_positions:
            if probs is None:
                raise InternalError("a sequence asked for masked positions but the batch ran no MLM head")
            job.mask_probs = job.mask_probs or [None] * job.count
            for row, slot in zip(rows, slots, strict=True):
                job.mask_probs[slot] = probs[batch.mask_rows[row]]
        job.tokens += sum(batch.sequences[row].length for row in rows)
        # A job's sequences are queued together, so its first one here waited as long as any.
        waited = batch.begun_at - batch.sequences[rows[0]].enqueued_at
        job.queued_s = max(job.queued_s, waited)
        job.batches[batch.started_at] = inference_s
        done[id(job)] = (job, done.get(id(job), (job, 0))[1] + len(rows))
    return list(done.values())


def _store_vectors(job: Job, slots: list[int], vectors: np.ndarray) -> None:
    if job.vectors is None:
        job.vectors = np.empty((job.count, *vectors.shape[1:]), dtype=np.float32)
    job.vectors[slots] = vectors
