"""The benchmark corpus (``data/corpus_zh.txt``, one sentence a line) and its token lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

CORPUS = Path(__file__).parent / "data" / "corpus_zh.txt"


def load_corpus(path: Path = CORPUS) -> list[str]:
    """The non-empty lines of ``path``."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def token_ids(model_dir: Path, texts: list[str], max_length: int = 512) -> list[np.ndarray]:
    """Each text's ids as the service computes them ([CLS] … [SEP], truncated to ``max_length``)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)]
