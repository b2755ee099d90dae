"""``python -m loadtest.models --quick``: both arrangements of three tiny models under the mixed load, the
background beside it, the memory of each and issue 33's targets, every row measured without an error. The
figures themselves are the machine's: not asserted."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.loadtest.conftest import run_module

ROUTES = ("/embed", "/rerank", "/token-classification")


def test_one_process_and_three_are_measured_under_the_same_mixed_load(tmp_path: Path) -> None:
    report = tmp_path / "models.json"
    stdout = run_module("loadtest.models", "--quick", "--out", str(report), timeout=600)
    for arrangement in ("one process, three models", "one process, with background", "three processes"):
        for route in ROUTES:
            row = re.search(
                rf"^{re.escape(arrangement)}\s+{re.escape(route)}\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+0$",
                stdout,
                re.M,
            )
            assert row is not None, (arrangement, route, stdout)
            assert float(row[2]) > 0
    assert re.search(r"^one process, with background\s+/embed \(u=7\)\s+8\s+[\d.]+\s", stdout, re.M), stdout
    memory = re.search(r"one process (\d+) MB, three (\d+) MB", stdout)
    assert memory is not None and int(memory[1]) > 0 and int(memory[2]) > 0
    targets = re.findall(r"^  \[(PASS|MISS)\] (.+?):", stdout, re.M)
    assert targets[0] == ("PASS", "every probe's answer, one process vs three")  # the same models: the same
    assert [name for _, name in targets] == [
        "every probe's answer, one process vs three",
        "total requests/s, one process vs three",
        *(f"{route} p99, one process vs three" for route in ROUTES),
        "PSS, one process vs three",
        "/rerank p99 beside the u=7 background vs without",
    ]
    written = json.loads(report.read_text())
    assert len(written["rows"]) == 3 + 4 + 3 and all(r["errors"] == 0 for r in written["rows"])
    assert written["pss_mb"]["one"] > 0 and len(written["targets"]) == 7
