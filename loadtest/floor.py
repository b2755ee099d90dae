"""The floor of a cell, the work per sentence that no design of the service can skip (:func:`floor`): CPU
time, in a spawned process (nothing of the caller's state counts or helps), of tokenising the cell's own
texts as the service does for /embed and writing their vectors into the JSON answer (orjson).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from loadtest.corpus import load_corpus, tokenizer_of, unique_texts

# Texts per tokeniser call: what the floor was measured with (the service batches across requests).
TOKENIZE_BATCH = 32
# Repeats of each measurement: the fastest is kept (the least disturbed by the other processes).
ROUNDS = 5


@dataclass(frozen=True)
class Floor:
    """µs of CPU per sentence: tokenising it and writing its vector."""

    tokenize_us: float
    write_us: float
    hidden: int
    texts: int

    @property
    def us(self) -> float:
        return self.tokenize_us + self.write_us


def _fastest(work: Callable[[], None], rounds: int = ROUNDS) -> float:
    """The least CPU seconds of ``rounds`` calls of ``work``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def measure(model: Path, texts_per_request: int, start: int, count: int) -> Floor:
    """The floor on ``count`` of the cell's texts (in this process; :func:`floor` runs it in its own)."""
    config = json.loads((model / "manifest.json").read_text())
    hidden = int(config["config"]["hidden_size"])
    max_length = int(config["tokenizer"]["max_length"])
    # On the calling thread, as the service encodes (app/model/tokenizer.py says why).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = tokenizer_of(model, max_length)
    texts = unique_texts(load_corpus(), start, count)
    chunks = [texts[i : i + TOKENIZE_BATCH] for i in range(0, len(texts), TOKENIZE_BATCH)]

    def tokenize() -> None:
        for chunk in chunks:
            tokenizer.encode_batch_fast(chunk, add_special_tokens=True)

    # Vectors like the service's: unit-length float32 rows (their digits are what orjson writes).
    rng = np.random.default_rng(0)
    requests = max(1, count // texts_per_request)
    vectors = rng.standard_normal((requests, texts_per_request, hidden)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)

    def write() -> None:
        for request in vectors:
            orjson.dumps(request[0] if texts_per_request == 1 else request, option=orjson.OPT_SERIALIZE_NUMPY)

    tokenize()  # warm: the first call builds the tokenizer's caches
    return Floor(
        tokenize_us=1e6 * _fastest(tokenize) / len(texts),
        write_us=1e6 * _fastest(write) / (requests * texts_per_request),
        hidden=hidden,
        texts=len(texts),
    )


def floor(model: Path, texts_per_request: int, start: int, count: int = 4096) -> Floor:
    """:func:`measure` in a process of its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, model, texts_per_request, start, count).result()
