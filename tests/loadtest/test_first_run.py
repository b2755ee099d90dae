"""``loadtest/first_run.py``: the kernel lines are attributed to their shape, and the CPU mode runs every
configuration it can in a child of its own. No timing thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.first_run import RESULT_MARK, SHAPE_MARK, parse_child, parse_shapes, table
from tests.loadtest.conftest import run_module

CYAN, RESET = "\x1b[36m", "\x1b[0m"


def _kernel_line(kernel: str, node: str = "Attention_0") -> str:
    return f"{CYAN}Operator=Attention Node={node} DataType=fp16 SdpaKernel={kernel}{RESET}"


def test_each_shape_gets_the_kernels_printed_between_its_marker_and_its_result() -> None:
    output = "\n".join(
        [
            f"{CYAN}AttentionKernelOptions: FLASH_ATTENTION=1 EFFICIENT_ATTENTION=1 CUDNN_FLASH_ATTENTION=1{RESET}",
            f"{SHAPE_MARK}warm",
            _kernel_line("FLASH_ATTENTION"),
            RESULT_MARK + json.dumps({"warm_ms": 40.0}),
            f"{SHAPE_MARK}1x16",
            _kernel_line("CUDNN_FLASH_ATTENTION"),
            _kernel_line("CUDNN_FLASH_ATTENTION", "Attention_1"),
            RESULT_MARK + json.dumps({"rows": 1, "length": 16, "first": 37.0, "second": 1.4}),
            f"{SHAPE_MARK}256x32",
            _kernel_line("EFFICIENT_ATTENTION"),
            _kernel_line("TRT_FUSED_ATTENTION", "Attention_1"),
            RESULT_MARK + json.dumps({"rows": 256, "length": 32, "first": 50.0, "second": 5.0}),
            f"{SHAPE_MARK}2x8",
            RESULT_MARK + json.dumps({"rows": 2, "length": 8, "first": 1.0, "second": 0.5}),
        ]
    )
    run = parse_child("defaults", output)
    assert run.warm_ms == 40.0
    assert run.kernel_options.startswith("AttentionKernelOptions: FLASH_ATTENTION=1")
    assert [(s.rows, s.length, s.kernel) for s in run.shapes] == [
        (1, 16, "CUDNN_FLASH_ATTENTION"),
        (256, 32, "EFFICIENT_ATTENTION+TRT_FUSED_ATTENTION"),
        (2, 8, "n/a"),
    ]
    rows = table([run])
    assert any("1x16" in r and r.rstrip().endswith("CUDNN_FLASH_ATTENTION") and "26.4" in r for r in rows), (
        rows
    )


def test_shapes_parse_as_rows_by_length() -> None:
    assert parse_shapes("1x16,256X32") == [(1, 16), (256, 32)]
    with pytest.raises(ValueError):
        parse_shapes("256")


@pytest.mark.slow  # two children on the tiny model: ~10 s
def test_the_cpu_mode_runs_what_the_cpu_can_and_skips_the_cuda_settings(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "first-run.json"
    args = ["--model", str(tiny_model_dir), "--provider", "CPUExecutionProvider", "--shapes", "1x8,3x20"]
    stdout = run_module("loadtest.first_run", *args, "--out", str(out))
    report = json.loads(out.read_text())
    runs = {r["config"]: r for r in report["runs"]}
    assert list(runs) == ["defaults", "sdpa-mem-efficient", "cudnn-off", "mem-pattern-off", "eager-loading"]
    for name in ("sdpa-mem-efficient", "cudnn-off", "eager-loading"):
        assert runs[name]["skipped"].startswith("CUDA only") and not runs[name]["shapes"], runs[name]
        assert f"{name:<20}  skipped: CUDA only" in stdout
    for name in ("defaults", "mem-pattern-off"):
        shapes = runs[name]["shapes"]
        assert [(s["rows"], s["length"]) for s in shapes] == [(1, 8), (3, 20)], shapes
        assert all(s["first_ms"] > 0 and s["second_ms"] > 0 and s["kernel"] == "n/a" for s in shapes), shapes
        assert runs[name]["warm_ms"] > 0
    assert report["configs"]["sdpa-mem-efficient"]["cuda_options"] == {"sdpa_kernel": "2"}
    assert report["configs"]["cudnn-off"]["env"] == {"ORT_ENABLE_CUDNN_FLASH_ATTENTION": "0"}
