"""`python -m export` as other tools call it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.model.resolve import EXIT_HUB_UNREACHABLE
from export.__main__ import parse_args

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, offline: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "export", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_unreachable_hub_id_is_one_clear_line_and_its_own_exit_status(tmp_path: Path) -> None:
    result = _run("--model", "bert-base-chinese", "--out", str(tmp_path / "m"))
    assert result.returncode == EXIT_HUB_UNREACHABLE  # the service tells its own users what to do
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "cannot reach the Hugging Face hub" in lines[0] and "--model /path/to/folder" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "m").exists()


def test_unreachable_hub_without_offline_flag_is_the_same_clear_error(tmp_path: Path) -> None:
    result = _run("--model", "bert-base-chinese", "--out", str(tmp_path / "m"), offline=False)
    assert result.returncode == EXIT_HUB_UNREACHABLE
    assert "cannot reach the Hugging Face hub" in result.stderr and "Traceback" not in result.stderr


def test_twin_export_says_random_weights(tiny_source_dir: Path, tmp_path: Path) -> None:
    result = _run(
        "--model", str(tiny_source_dir), "--out", str(tmp_path / "m"), "--twin", "--variants", "int8"
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["source"]["weights"] == "random"
    assert manifest["source"]["weights_sha256"] is None
    assert list(manifest["graphs"]["encoder"]) == ["int8"]
    # int8 error on random weights means nothing: recorded, not enforced.
    assert manifest["validation"]["int8"]["metrics"]["cosine_min"]["enforced"] is False
    assert "[export] validate int8" in result.stdout


def test_folder_without_weights_needs_twin(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    result = _run("--model", str(folder), "--out", str(tmp_path / "m"))
    assert result.returncode == 2
    assert "--twin" in result.stderr and "Traceback" not in result.stderr


def test_variants_flag_rejects_unknown_names() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--variants", "fp32,bf16"])
    assert parse_args(["--out", "x", "--variants", "int8,fp32"]).variants == ("fp32", "int8")


def test_matryoshka_dimensions_flag_takes_widths_or_any(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--out", "m"]).matryoshka_dimensions is None
    assert parse_args(["--out", "m", "--matryoshka-dimensions", "64, 32,16"]).matryoshka_dimensions == (
        64,
        32,
        16,
    )
    assert parse_args(["--out", "m", "--matryoshka-dimensions", "any"]).matryoshka_dimensions == "any"
    for bad in ("0,16", "sixteen", ""):
        with pytest.raises(SystemExit):
            parse_args(["--out", "m", "--matryoshka-dimensions", bad])
        assert "comma list of widths" in capsys.readouterr().err
