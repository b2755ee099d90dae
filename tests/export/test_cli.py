"""`python -m export` as other tools call it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.model.resolve import EXIT_EXPORT_ERROR, EXIT_HUB_UNREACHABLE
from export.__main__ import parse_args
from loadtest.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(
    *args: str, offline: bool = True, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(extra_env or {})}
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


def test_a_modelscope_id_without_the_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "modelscope"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named modelscope')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim.parent), str(ROOT)])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "--model",
            "modelscope:BAAI/bge-small-zh-v1.5",
            "--out",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert result.returncode == EXIT_EXPORT_ERROR
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'zhembed[modelscope]'" in lines[0], result.stderr
    assert not (tmp_path / "m").exists()


def test_a_modelscope_id_exports_from_modelscopes_cache(tiny_source_dir: Path, tmp_path: Path) -> None:
    """The real modelscope snapshot_download, ModelScope unreachable (a loopback port nothing listens on):
    the checkpoint an earlier download left in modelscope's cache is exported, its source so named."""
    pytest.importorskip("modelscope", reason="the modelscope extra (installed by the dev extra)")
    shutil.copytree(
        tiny_source_dir, tmp_path / "ms" / "models" / "BAAI--bge-small-zh-v1.5" / "snapshots" / "v1"
    )
    env = {
        "MODELSCOPE_CACHE": str(tmp_path / "ms"),
        "MODELSCOPE_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1",
    }
    model = "modelscope:BAAI/bge-small-zh-v1.5"
    result = _run(
        "--model",
        model,
        "--revision",
        "v1",
        "--out",
        str(tmp_path / "m"),
        "--variants",
        "int8",
        extra_env=env,
    )
    assert result.returncode == 0, result.stderr
    source = json.loads((tmp_path / "m" / "manifest.json").read_text())["source"]
    assert (source["model"], source["revision"], source["weights"]) == (model, "v1", "pretrained")
