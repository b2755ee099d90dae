"""``python -m loadtest.int8_recipes --quick`` runs end to end on real weights, so the comparison never rots.

It asserts what the recipe promises on all-MiniLM-L6-v2, measured by the harness: the default int8 graph
keeps the export's precision gate, and a text's vector does not depend on its batch (while the dynamic
graph's does). Speed is printed, never asserted: CI machines are shared."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from loadtest.int8_recipes import cpu_features, split
from tests.loadtest.conftest import run_module


def _row(output: str, name: str) -> list[float]:
    line = next(line for line in output.splitlines() if line.startswith(name))
    return [float(x) for x in re.findall(r"\d+\.\d+(?:e[-+]\d+)?", line[len(name) :])]


@pytest.mark.slow  # exports all-MiniLM-L6-v2 and two int8 graphs of it: ~40 s on 2 cores
def test_quick_comparison_shows_precision_batch_independence_and_speed() -> None:
    out = run_module("loadtest.int8_recipes", "--quick", "--profile", "--threads", "1")
    cosine_min, _, _, dependence, _ = _row(out, "per_token (default)")
    assert cosine_min >= 0.99
    assert dependence <= 1e-6
    assert _row(out, "dynamic")[3] > 1e-3  # one scale per batch: the harness does see dependence
    speed = out[out.index("sentences/s") :]
    for name in ("fp32", "per_token (default)", "dynamic"):
        rates = _row(speed, name)
        assert len(rates) == 8 and all(r > 0 for r in rates[0::2]), (name, rates)
    assert "MatMulIntegerToFloat" in out[out.index("kernel time per op type") :]
    assert "CPU features: avx2 " in out
    split_table = out[out.index("GEMM and the rest") :]
    assert _row(split_table, "per_token (default)") and _row(split_table, "dynamic")


def test_the_header_names_each_int8_feature() -> None:
    flags = {"avx2", "avx512f", "avx_vnni", "fpu"}
    assert cpu_features(flags) == "avx2 yes, avx512 yes, vnni yes (avx_vnni), amx no"
    assert cpu_features(set()) == "avx2 no, avx512 no, vnni no, amx no"


def test_gemm_time_is_split_from_the_rest() -> None:
    per_op = Counter({"MatMulIntegerToFloat": 30, "DynamicQuantizeMatMul": 20, "Mul": 7, "QuantizeLinear": 3})
    assert split(per_op) == (50, 10)
