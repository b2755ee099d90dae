"""A worker's memory as the supervisor reads it (:func:`app.serving.memory.memory_bytes`)."""

from __future__ import annotations

import os

from app.serving.memory import memory_bytes
from app.serving.slots import MB


def test_the_memory_reader_reads_this_process() -> None:
    mine = memory_bytes(os.getpid())
    assert mine is not None and 1 * MB < mine < 64 * 1024 * MB
    assert memory_bytes(2**22 + 12345) is None  # past pid_max: no such process
