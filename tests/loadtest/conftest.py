"""Helpers for the loadtest tests: run a benchmark module as CI would, in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """``python -m module args`` from the project root, with ``env`` added to the environment; its
    stdout. Fails the test on a non-zero exit."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout
