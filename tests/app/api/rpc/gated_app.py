"""``python -m tests.app.api.rpc.gated_app``: ``python -m app`` (one worker) whose every model run waits
until the file named by ``ZHEMBED_TEST_GATE`` exists, so that a test over gRPC can hold the admission
budget full as ``tests/app/conftest.py``'s ``gate_inference`` does in process (the server runs in a
process of its own: grpc_process.py says why). Start it with ``ZHEMBED_WARMUP=false`` and the gate
open: the warm-up and the cost model's calibration run the model too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.model.runtime import OnnxModel
from app.serving.main import main

_run = OnnxModel.encode


def _gated(self: OnnxModel, *args: Any, **kwargs: Any) -> list[np.ndarray]:
    gate = Path(os.environ["ZHEMBED_TEST_GATE"])
    while not gate.exists():  # the inference thread's own wait, not a test's clock
        time.sleep(0.01)
    return _run(self, *args, **kwargs)


if __name__ == "__main__":
    OnnxModel.encode = _gated  # type: ignore[method-assign]
    sys.exit(main())
