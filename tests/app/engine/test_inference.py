"""Stage 4: one padded batch through the encoder, only the outputs its items need."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import numpy as np

from app.engine.batching import Batcher
from app.engine.inference import Inference
from app.engine.postprocess import split_batch
from app.engine.work import Job, Need, Seq
from app.model.manifest import POOLER_OUTPUT
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock


def _items(loop: asyncio.AbstractEventLoop, needs: list[Need], lengths: list[int]) -> list[Seq]:
    job = Job(loop, len(needs))
    return [
        Seq(np.array([101, *range(670, 668 + n), 102], np.int64), need, job, i, 0.0)  # never queued
        for i, (need, n) in enumerate(zip(needs, lengths, strict=True))
    ]


def inference_of(model: Any) -> Inference:
    """An inference stage whose batches are run by hand (:meth:`Inference.run_batch`); its queue stays empty."""
    metrics = Metrics()
    return Inference(model, Batcher(4096, 64, 0.0, 64, metrics), metrics)


def test_a_batch_pads_fetches_only_what_is_needed_and_splits_back(tiny_model: Any) -> None:
    inference = inference_of(tiny_model)
    loop = asyncio.new_event_loop()
    try:
        items = _items(loop, [Need(layers=(1,), pooling="cls"), Need(layers=(3,), pooling="pooler")], [3, 6])
        finished = inference.run_batch(items)
    finally:
        loop.close()
    assert finished.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    # The [CLS] vector of layer 1 comes pooled from the graph: [batch, hidden], no per-token states.
    cls_1 = tiny_model.pooled_output(1, "cls")
    assert cls_1 is not None and set(finished.outputs) == {cls_1, POOLER_OUTPUT}
    assert finished.outputs[cls_1].shape == (2, tiny_model.hidden_size)
    assert finished.mask_logits is None
    ((job, done),) = split_batch(finished)
    assert done == 2 and job.vectors is not None and job.vectors.shape == (2, 1, tiny_model.hidden_size)
    np.testing.assert_array_equal(job.vectors[0, 0], finished.outputs[cls_1][0])
    np.testing.assert_array_equal(job.vectors[1, 0], finished.outputs[POOLER_OUTPUT][1])
    assert job.batches == {finished.started_at: finished.finished_at - finished.started_at}
    assert inference.stats.batches == 1 and inference.stats.items == 2


def test_a_graph_without_pooled_outputs_is_pooled_from_its_token_states(tiny_model: Any) -> None:
    model = copy.copy(tiny_model)
    model.pooled_output = lambda layer, mode: None
    pooled, fallback = inference_of(tiny_model), inference_of(model)
    loop = asyncio.new_event_loop()
    try:
        needs = [Need(layers=(2, 3), pooling="mean"), Need(layers=(1,), pooling="cls")]
        graph, numpy = (i.run_batch(_items(loop, needs, [3, 7])) for i in (pooled, fallback))
    finally:
        loop.close()
    assert set(numpy.outputs) == {tiny_model.output_name(layer) for layer in (1, 2, 3)}
    assert all(v.ndim == 2 for v in graph.outputs.values())  # only [batch, hidden] left the session
    ((a, _),) = split_batch(graph)
    ((b, _),) = split_batch(numpy)
    assert a.vectors is not None and b.vectors is not None
    np.testing.assert_allclose(a.vectors, b.vectors, rtol=0, atol=1e-6)


def test_masked_positions_run_the_head_on_the_last_layer(tiny_model: Any) -> None:
    inference = inference_of(tiny_model)
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


def test_a_sequences_queue_wait_is_read_on_the_engines_clock(tiny_model: Any) -> None:
    clock = FakeClock(0.0)
    metrics = Metrics()
    inference = Inference(tiny_model, Batcher(4096, 64, 0.0, 64, metrics, clock=clock), metrics)
    loop = asyncio.new_event_loop()
    try:
        items = _items(loop, [Need(layers=(1,), pooling="cls")], [5])  # queued at 0.0
        clock.advance(0.25)
        finished = inference.run_batch(items)
    finally:
        loop.close()
    ((job, _),) = split_batch(finished)
    assert job.queued_s == 0.25
