"""What loadtest.server reads from /proc and /metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest.server import CLOCK_TICKS, descendants, parse_exposition, tree_cpu_seconds

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(60)"


def _own_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def test_cpu_time_includes_the_worker_processes() -> None:
    # A parent that only waits, and a child (a "worker") that burns 0.5 s of CPU and then idles.
    parent = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$BURN" & wait'],
        env={**os.environ, "BURN": BURN},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while tree_cpu_seconds(parent.pid) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(descendants(parent.pid)) == 1
        assert tree_cpu_seconds(parent.pid) >= 0.45
        assert _own_cpu_seconds(parent.pid) < 0.2
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_exposition_parses_to_series_by_name_and_labels() -> None:
    text = (
        "# HELP zhembed_batch_size Inputs per batch.\n"
        "# TYPE zhembed_batch_size histogram\n"
        'zhembed_batch_size_bucket{le="8.0"} 3.0\n'
        "zhembed_batch_size_sum 17.0\n"
        "zhembed_batch_size_count 3.0\n"
        'zhembed_cache_hits_total{tier="memory"} 2.5e+03\n'
    )
    series = parse_exposition(text)
    assert series == {
        'zhembed_batch_size_bucket{le="8.0"}': 3.0,
        "zhembed_batch_size_sum": 17.0,
        "zhembed_batch_size_count": 3.0,
        'zhembed_cache_hits_total{tier="memory"}': 2500.0,
    }
