"""The py-spy summaries of loadtest/pyspy.py, on a hand-written collapsed-stack file."""

from __future__ import annotations

from pathlib import Path

from loadtest.pyspy import inclusive_shares, summarise

STACKS = """\
thread (1): MainThread;run (a.py:1);handle (b.py:2);json_response (c.py:3) 6
thread (1): MainThread;run (a.py:1);handle (b.py:2) 2
thread (1): MainThread;run (a.py:1);enabled (d.py:4) 2
thread (2): worker;wait (e.py:5) 10
"""


def test_inclusive_share_counts_callees_within_the_thread(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(STACKS)
    text = inclusive_shares(stacks, ["handle", "enabled", "absent"])
    lines = text.splitlines()
    assert "80.0%  handle  (of thread (1): MainThread)" in lines[0]
    assert "20.0%  enabled" in lines[1]
    assert lines[2].strip() == "not sampled: absent"


def test_leaf_summary_splits_threads(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(STACKS)
    text = summarise(stacks, top=1, python_leaf=False)
    assert "thread (1): MainThread: 10 samples, 50.0% of all" in text
    assert "30.0%  json_response (c.py:3)" in text
