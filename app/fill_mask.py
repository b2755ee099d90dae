"""Fill-mask answers in the Hugging Face pipeline's terms: the top k tokens for each [MASK]."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.layers import top_k as top_k_of
from app.model.tokenizer import TextTokenizer

# Each [MASK] holds a probability row over the vocabulary (bert-base-chinese: 21128 floats, 84 kB) until
# its request is answered, and costs top_k decodes on the event loop; this keeps one request near 10 MB.
MAX_MASKS_PER_REQUEST = 128


def predictions(
    tokenizer: TextTokenizer, ids: np.ndarray, positions: tuple[int, ...], probs: np.ndarray, top_k: int
) -> list[list[dict[str, Any]]]:
    """For each masked position of ``ids`` (one [vocab] row of ``probs`` each), the ``top_k`` fills."""
    single = len(positions) == 1
    out = []
    for position, row in zip(positions, probs, strict=True):
        tokens, scores = top_k_of(row, top_k)
        filled_in = []
        for token, score in zip(tokens, scores, strict=True):
            filled = ids.copy()
            filled[position] = token
            filled_in.append(
                {
                    "score": score,
                    "token": token,
                    "token_str": tokenizer.decode([token], skip_special_tokens=False),
                    # Like the HF pipeline: with several masks the others stay visible.
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=single),
                }
            )
        out.append(filled_in)
    return out
