"""Stage 4: one padded batch through the encoder, only the outputs its items need."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from app.engine.inference import Inference
from app.engine.postprocess import PostProcessing, split_batch
from app.engine.work import Job, Need, Sequence
from app.metrics import Metrics
from app.model.manifest import POOLER_OUTPUT


def _items(loop: asyncio.AbstractEventLoop, needs: list[Need], lengths: list[int]) -> list[Sequence]:
    job = Job(loop, len(needs))
    return [
        Sequence(np.array([101, *range(670, 668 + n), 102], np.int64), need, job, i)
        for i, (need, n) in enumerate(zip(needs, lengths, strict=True))
    ]


def test_a_batch_pads_fetches_only_what_is_needed_and_splits_back(tiny_model: Any) -> None:
    inference = Inference(tiny_model, PostProcessing(), Metrics())
    loop = asyncio.new_event_loop()
    try:
        items = _items(loop, [Need(layers=(1,), pooling="cls"), Need(layers=(3,), pooling="pooler")], [3, 6])
        finished = inference.run_batch(items)
    finally:
        loop.close()
    assert finished.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert set(finished.outputs) == {tiny_model.output_name(1), POOLER_OUTPUT}
    assert finished.mask_logits is None
    ((job, done),) = split_batch(finished)
    assert done == 2 and job.vectors is not None and job.vectors.shape == (2, 1, tiny_model.hidden_size)
    np.testing.assert_array_equal(job.vectors[0, 0], finished.outputs[tiny_model.output_name(1)][0, 0])
    np.testing.assert_array_equal(job.vectors[1, 0], finished.outputs[POOLER_OUTPUT][1])
    assert job.batches == {finished.started_at: finished.finished_at - finished.started_at}
    assert inference.stats.batches == 1 and inference.stats.items == 2


def test_masked_positions_run_the_head_on_the_last_layer(tiny_model: Any) -> None:
    inference = Inference(tiny_model, PostProcessing(), Metrics())
    loop = asyncio.new_event_loop()
    try:
        items = _items(loop, [Need(mask_positions=(1, 2)), Need(layers=(2,), tokens=True)], [4, 3])
        finished = inference.run_batch(items)
    finally:
        loop.close()
    assert finished.mask_logits is not None and finished.mask_logits.shape[0] == 2
    ((job, _),) = split_batch(finished)
    probs = job.mask_probs[0]
    assert probs is not None
    np.testing.assert_allclose(probs.sum(axis=-1), [1, 1], rtol=1e-5)
    states = job.token_states[1]
    assert finished.attention_mask.shape == (2, 4)
    assert states is not None and states.shape == (1, 3, tiny_model.hidden_size)  # no padding row
