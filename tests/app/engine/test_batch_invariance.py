"""The same vector for the same text, whatever the batch (docs/api.md): what the tests' tolerance stands on.

Each text is run alone, then padded beside longer texts, at another row, in batches of 2 to 16, on the
tiny model's fp32 and int8 graphs, through the inference stage and the batch split the service uses.
Measured here (CPU): the encoder's states of a text's own tokens, so its [CLS] vector and its token rows,
are identical bytes in every batching, fp32 and int8 alike (the int8 graph quantises each token's
activations with its own scale, export/quantize.py, so no other row sets its range). The mean-pooled
vector is not: the graph sums the states over the padded length, and a longer sum may round its last
bits differently (up to ~2.4e-7 of the vector's largest component); it is within the stated tolerance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.postprocess import split_batch
from app.engine.work import Job, Need, Seq
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings
from tests.app.engine.test_inference import inference_of
from tests.app.vectors import assert_same_vectors

TEXTS = ["你好", "今天天气很好", "我们去公园散步吧，顺便买点水果。"]
COMPANY = [
    "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。" * 2,
    "长城是古代中国为抵御外敌而修筑的规模浩大的军事工程。",
    "好",
]


@pytest.fixture(scope="module", params=["fp32", "int8"])
def model(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[OnnxModel]:
    yield load_model(Settings(model=str(tiny_model_dir), variant=request.param, intra_op_threads=1))


# Rows of each batch: 0 is the text under test, 1-3 the company (long, middle, one character).
BATCHINGS = [
    [0],
    [0, 1],
    [1, 0],
    [0] * 8,
    [2, 0, 3, 1],
    [1] * 5 + [0] + [3] * 10,
]


def run(model: OnnxModel, ids: list[np.ndarray], rows: list[int], need: Need) -> list[np.ndarray]:
    """The target's answers (one per row it holds in the batch): its vector, or its token rows."""
    loop = asyncio.new_event_loop()
    try:
        mine, theirs = Job(loop, rows.count(0)), Job(loop, len(rows) - rows.count(0))
        batch, slots = [], {0: 0, 1: 0}
        for row in rows:
            job, which = (mine, 0) if row == 0 else (theirs, 1)
            batch.append(Seq(ids[row], need, job, slots[which], 0.0))  # run by hand: never queued
            slots[which] += 1
        split_batch(inference_of(model).run_batch(batch))
    finally:
        loop.close()
    if need.tokens:
        return [s for s in mine.token_states if s is not None]
    assert mine.vectors is not None
    return list(mine.vectors)


@pytest.mark.parametrize("text", range(len(TEXTS)))
def test_a_texts_vectors_do_not_depend_on_its_batch(model: OnnxModel, text: int) -> None:
    encodings = model.tokenizer.encode_batch([TEXTS[text], *COMPANY], True)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    last = (model.num_layers,)
    for need in (Need(layers=last, pooling="cls"), Need(layers=last, tokens=True)):
        alone = run(model, ids, [0], need)[0]
        for rows in BATCHINGS:
            for got in run(model, ids, rows, need):
                assert got.tobytes() == alone.tobytes(), (model.variant, need, rows)
    mean = Need(layers=last, pooling="mean")
    alone = run(model, ids, [0], mean)[0]
    for rows in BATCHINGS:
        for got in run(model, ids, rows, mean):
            assert_same_vectors(got, alone, f"{model.variant} {rows}")
