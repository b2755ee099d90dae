"""loadtest.memory's readings: private memory by kind of mapping adds up to the whole (loadtest.procs's
USS), and grows with what the process holds."""

from __future__ import annotations

import json
import subprocess
import sys

from loadtest.memory import VARIANTS

# Read in a child of its own: a test worker's other threads (ONNX Runtime's, earlier tests' event loops)
# allocate between two readings, and the sum then misses the whole by more than any tolerance (CI: 10 MB).
READINGS = """
import json
import os
import numpy as np
from loadtest import procs
from loadtest.memory import uss_by_kind
before = uss_by_kind()
whole = procs.memory(os.getpid()).uss / procs.MB
held = np.ones(64 * 2**20 // 8)  # 64 MB, touched
after = uss_by_kind()
print(json.dumps({"before": before, "whole": whole, "after": after}))
"""


def test_private_memory_by_kind_adds_up_and_sees_an_allocation() -> None:
    run = subprocess.run(
        [sys.executable, "-c", READINGS], capture_output=True, text=True, timeout=60, check=True
    )
    readings = json.loads(run.stdout)
    before, after = readings["before"], readings["after"]
    assert (
        abs(sum(before.values()) - readings["whole"]) < 4
    )  # the same pages, one thread, read a moment apart
    assert after["anon"] + after["heap"] - before["anon"] - before["heap"] > 48


def test_every_variant_turns_off_what_its_name_says() -> None:
    assert VARIANTS["default"] == {}
    assert VARIANTS["trim-off"] == {"ZHEMBED_MEMORY_TRIM_BATCHES": "0", "ZHEMBED_MMAP_THRESHOLD_KB": "0"}
    assert VARIANTS["mmap-env"]["MALLOC_MMAP_THRESHOLD_"] == "131072"
