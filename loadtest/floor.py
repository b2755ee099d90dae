"""The floor of a cell: the work per sentence that no design of the service can skip (issue 19).

    python -m loadtest.floor --model DIR --texts 32 --start N [--count 4096]

CPU time, in a process of its own (nothing of the caller's state counts or helps), of tokenising the
cell's own texts as the service does for /embed and writing their vectors into the JSON answer (orjson,
``[texts, hidden]`` per call). Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from loadtest.corpus import load_corpus, tokenizer_of, unique_texts
from loadtest.harness import parser

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
    """:func:`measure` in a process of its own.

    Raises:
        RuntimeError: the process failed (its stderr's end says why).
    """
    command = [sys.executable, "-m", "loadtest.floor", "--model", str(model)]
    command += ["--texts", str(texts_per_request), "--start", str(start), "--count", str(count)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadtest.floor failed: {done.stderr.strip()[-500:]}")
    raw = json.loads(done.stdout)
    return Floor(raw["tokenize_us"], raw["write_us"], raw["hidden"], raw["texts"])


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.floor", __doc__)
    p.add_argument("--model", type=Path, required=True, help="an exported model folder")
    p.add_argument("--texts", type=int, required=True, help="texts per request of the cell")
    p.add_argument("--start", type=int, default=0, help="the first text (loadtest.corpus.unique_texts)")
    p.add_argument("--count", type=int, default=4096, help="texts to measure on")
    args = p.parse_args(argv)
    result = measure(args.model, args.texts, args.start, args.count)
    print(json.dumps({**result.__dict__, "us": result.us}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
