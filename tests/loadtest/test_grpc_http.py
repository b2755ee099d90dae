"""``python -m loadtest.grpc_http --quick``: the same load over both protocols, each cell measured."""

from __future__ import annotations

import re

from tests.loadtest.conftest import run_module


def test_both_protocols_are_measured_side_by_side() -> None:
    stdout = run_module("loadtest.grpc_http", "--quick")
    for protocol in ("http", "grpc", "grpc tei"):
        row = re.search(rf"^{re.escape(protocol)}\s+(\d+)\s+([\d.]+)\s+(\d+)\s+[\d.]+\s+0$", stdout, re.M)
        assert row is not None, stdout
        assert int(row[1]) > 0 and int(row[3]) > 0
    assert re.search(r"^grpc / http: sentences/s [\d.]+x, server CPU per sentence [\d.]+x$", stdout, re.M)
