"""The benchmark corpus (``data/corpus_zh.txt``, one sentence a line), its texts as the engine tokenises
them, and request bodies made from it.

The locustfile reads it too, in the stock Locust image: only the standard library is imported at the top.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

CORPUS = Path(__file__).parent / "data" / "corpus_zh.txt"
# The 100%-hit workload's texts (bench's cache row, pyspy --cache-hits): the corpus's first 64.
HIT_SET = 64


def load_corpus(path: Path = CORPUS) -> list[str]:
    """The non-empty lines of ``path`` (SystemExit when it has none)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"loadtest: no sentences in {path}")
    return lines


def tokenizer_of(model_dir: Path, max_length: int = 512) -> Tokenizer:
    """The model's tokenizer, unpadded, truncating to ``max_length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def encode(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids as the engine's tokenisation thread encodes them: 256 a call, no offsets."""
    import numpy as np

    return [
        np.asarray(e.ids, dtype=np.int64)
        for i in range(0, len(texts), 256)
        for e in tokenizer.encode_batch_fast(texts[i : i + 256], add_special_tokens=True)
    ]


def request_bodies(corpus: list[str], per_request: int, seed: int = 0) -> list[bytes]:
    """``/embed`` bodies of ``per_request`` texts each (one as a string, more as a list) covering the corpus
    once, shuffled by ``seed``; the last body wraps around to the start."""
    import orjson

    texts = corpus[:]
    random.Random(seed).shuffle(texts)
    if per_request == 1:
        return [orjson.dumps({"inputs": t}) for t in texts]
    ring = texts + texts[:per_request]
    return [orjson.dumps({"inputs": ring[i : i + per_request]}) for i in range(0, len(texts), per_request)]


def unique_texts(corpus: list[str], start: int, count: int) -> list[str]:
    """Texts ``start`` … ``start + count - 1`` of an endless sequence of distinct texts: corpus sentences
    with their number in front, so that neither de-duplication nor a cache can serve one from another."""
    return [f"{n:07d} {corpus[n % len(corpus)]}" for n in range(start, start + count)]


def distinct_texts(corpus: list[str], texts: int, start: int) -> Callable[[int], list[str]]:
    """The n-th request's texts: ``start + n·texts`` … of :func:`unique_texts`, never one twice."""
    return lambda n: unique_texts(corpus, start + n * texts, texts)
