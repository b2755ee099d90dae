"""``python -m loadtest.http_path`` drives the app in-process, through the data path and the stack behind it."""

from __future__ import annotations

import re

from tests.loadtest.conftest import run_module


def test_each_case_is_measured_through_both_paths() -> None:
    stdout = run_module("loadtest.http_path", "--requests", "60", "--repeats", "2")
    for case in ("1 text", "32 texts", "32 texts, base64"):
        row = re.search(rf"^  {re.escape(case)}\s+([\d.]+) \(\s*[\d.]+\)\s+([\d.]+) \(", stdout, re.M)
        assert row is not None, stdout
        assert float(row[1]) > 0 and float(row[2]) > 0
    assert re.search(r"\(this harness\)\s+[\d.]+", stdout)
