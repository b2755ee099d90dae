"""Stage 5: a finished batch split into one result per item."""

from __future__ import annotations

import asyncio

import numpy as np

from app.engine import postprocess
from app.engine.work import Job, Need, Seq


def test_softmax_sums_to_one() -> None:
    probs = postprocess.softmax(np.array([[1.0, 3.0, 2.0, 0.0]], dtype=np.float32))[0]
    assert abs(probs.sum() - 1) < 1e-6
    assert int(np.argmax(probs)) == 1


def _batch(outputs: dict[str, np.ndarray], needs: list[Need], jobs: list[Job]) -> postprocess.FinishedBatch:
    """One sequence per (need, job) pair in order, each the next slot of its job."""
    seqs, slots = [], dict.fromkeys(map(id, jobs), 0)
    for need, job in zip(needs, jobs, strict=True):
        seqs.append(Seq(np.ones(4, np.int64), need, job, slots[id(job)], 0.0))
        slots[id(job)] += 1
    rows = len(seqs)
    return postprocess.FinishedBatch(
        sequences=seqs, attention_mask=np.ones((rows, 4), np.int64), outputs=outputs, mask_rows={},
        mask_logits=None, sparse={}, sparse_vectors=None, output_names={1: "h1", 2: "h2"}, started_at=0.0,
        finished_at=0.0, begun_at=0.0, pooled_names={(1, "mean"): "mean_1", (2, "mean"): "mean_2"},
    )  # fmt: skip


def test_pooled_vectors_land_in_each_jobs_slots_for_one_layer_and_for_two() -> None:
    rng = np.random.default_rng(5)
    outputs = {f"mean_{k}": rng.standard_normal((5, 8)).astype(np.float32) for k in (1, 2)}
    loop = asyncio.new_event_loop()
    try:
        one, two = Job(loop, 3), Job(loop, 2)
        last, both = Need(layers=(2,), pooling="mean"), Need(layers=(2, 1), pooling="mean")
        batch = _batch(outputs, [last, both, last, both, last], [one, two, one, two, one])
        done = postprocess.split_batch(batch)
    finally:
        loop.close()
    assert sorted(n for _, n in done) == [2, 3]
    assert one.vectors is not None and two.vectors is not None
    want_one = np.stack([outputs["mean_2"][[0, 2, 4]]], axis=1)
    want_two = np.stack([outputs["mean_2"][[1, 3]], outputs["mean_1"][[1, 3]]], axis=1)
    assert one.vectors.tobytes() == want_one.tobytes() and one.vectors.shape == (3, 1, 8)
    assert two.vectors.tobytes() == want_two.tobytes() and two.vectors.shape == (2, 2, 8)
