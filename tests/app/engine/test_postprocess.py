"""Stage 5: a finished batch split into one result per item."""

from __future__ import annotations

import numpy as np

from app.engine import postprocess


def test_softmax_sums_to_one() -> None:
    probs = postprocess.softmax(np.array([[1.0, 3.0, 2.0, 0.0]], dtype=np.float32))[0]
    assert abs(probs.sum() - 1) < 1e-6
    assert int(np.argmax(probs)) == 1
