"""``python -m loadtest.loop_lag_grpc``: a row per gRPC method's heaviest request, each with /health's
latency while it ran and what the server answered (no figure is asserted: they are the machine's)."""

from __future__ import annotations

import re

from tests.loadtest.conftest import run_module

ROW = re.compile(r"^(?:tei|zhembed) (\w+) +(.+?) +[\d.]+ +[\d.]+ +[\d.]+  (\S.*)$", re.M)


def test_each_row_is_probed_and_says_what_the_server_answered() -> None:
    stdout = run_module(
        "loadtest.loop_lag_grpc", "--quick", "--methods", "Tokenize,Decode,RerankStream", "--repeat", "1"
    )
    rows = ROW.findall(stdout)
    assert [method for method, _, _ in rows] == ["Tokenize", "Decode", "Decode", "RerankStream"], stdout
    (_, _, tokenize), (_, _, whole_body), (_, _, longest), (_, _, rerank) = rows
    assert tokenize == "OK" and longest == "OK"  # the most each allows
    assert whole_body.startswith("INVALID_ARGUMENT: ") and "ids in one Decode" in whole_body  # 2 MiB of ids
    assert rerank.startswith("INVALID_ARGUMENT: more than 64 texts in one stream")
