"""``python -m app.bulk`` as a person meets it: exit statuses, one-line refusals, a second run into the
same folder, int8 output, and the zhembed console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.bulk.cli import EXIT_CANNOT_RUN, EXIT_OK, EXIT_SKIPPED
from tests.app.bulk.conftest import TEXTS, embeddings, manifest, run_bulk, shards, write_jsonl
from tests.app.vectors import assert_same_bits

ROOT = Path(__file__).resolve().parents[3]


def last_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[-1] if lines else ""


def test_all_rows_embedded_is_0_and_skipped_rows_are_3(
    tiny_model_dir: Path, corpus: Path, tmp_path: Path
) -> None:
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "a") == EXIT_OK
    counts = manifest(tmp_path / "a")["counts"]
    assert counts == {**counts, "rows": len(TEXTS), "embedded": len(TEXTS), "skipped": 0, "shards": 1}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "好"}, {"text": ""}])
    assert run_bulk(tiny_model_dir, bad, tmp_path / "b") == EXIT_SKIPPED
    assert manifest(tmp_path / "b")["counts"]["skipped"] == 1


def test_a_malformed_input_stops_the_job_with_one_line_and_2(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = b"".join(b'{"text": "%d"}\n' % i for i in range(30)) + b"{oops\n"
    (tmp_path / "c.jsonl").write_bytes(rows)
    assert (
        run_bulk(tiny_model_dir, tmp_path / "c.jsonl", tmp_path / "out", "--shard-rows", "10")
        == EXIT_CANNOT_RUN
    )
    assert last_line(capsys).startswith(f"zhembed bulk: {tmp_path / 'c.jsonl'} line 31: not JSON")
    # The shards finished before it stay; the one it was in never appears.
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert run_bulk(tiny_model_dir, tmp_path / "nope.jsonl", tmp_path / "out2") == EXIT_CANNOT_RUN
    assert last_line(capsys) == f"zhembed bulk: {tmp_path / 'nope.jsonl'} does not exist"


def test_options_the_model_refuses_are_one_line_before_any_row(
    tiny_model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--layer-combine", "difference") == EXIT_CANNOT_RUN
    )
    assert last_line(capsys).startswith(
        "zhembed bulk: the options do not fit this model: layer_combine 'difference' takes exactly two layers"
    )
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--prompt-name", "query") == EXIT_CANNOT_RUN
    assert "prompt_name 'query' is not one of this model's prompts" in last_line(capsys)
    assert not (tmp_path / "out").exists()


def test_another_job_in_the_folder_is_refused_in_one_line_unless_overwrite(
    tiny_model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run_bulk(tiny_model_dir, corpus, out) == EXIT_OK
    before = {p: p.stat().st_mtime_ns for p in out.glob("part-*")}
    # The same command again: nothing to do, nothing rewritten.
    assert run_bulk(tiny_model_dir, corpus, out) == EXIT_OK
    assert {p: p.stat().st_mtime_ns for p in out.glob("part-*")} == before
    assert run_bulk(tiny_model_dir, corpus, out, "--pooling", "cls") == EXIT_CANNOT_RUN
    assert last_line(capsys) == (
        f'zhembed bulk: {out} holds embeddings of other options (pooling: "mean" there, "cls" here): rerun with '
        "--overwrite to replace them, or choose another --output"
    )
    assert main_with(tiny_model_dir, corpus, out, "--variant", "int8") == EXIT_CANNOT_RUN
    assert "holds embeddings of another model (digest " in last_line(capsys)
    assert run_bulk(tiny_model_dir, corpus, out, "--encoding", "int8") == EXIT_CANNOT_RUN
    assert run_bulk(tiny_model_dir, corpus, out, "--pooling", "cls", "--overwrite") == EXIT_OK
    assert manifest(out)["options"]["pooling"] == "cls"


def main_with(model: Path, corpus: Path, out: Path, *flags: str) -> int:
    from app.bulk.cli import main

    return main(
        ["--model", str(model), "--input", str(corpus), "--output", str(out), "--progress", "off", *flags]
    )


def test_int8_output_is_what_post_embed_sends_for_int8(
    client: httpx.Client, tiny_model_dir: Path, corpus: Path, tmp_path: Path
) -> None:
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--encoding", "int8") == EXIT_OK
    table = shards(tmp_path / "out")
    values = embeddings(table)
    wire = client.post("/embed", json={"inputs": TEXTS, "encoding": "int8"}).json()
    assert np.abs(values.astype(int) - np.array([w["values"] for w in wire])).max() <= 1  # a float's last bit
    assert np.allclose(table.column("scale").to_pylist(), [w["scale"] for w in wire], rtol=1e-5)


def test_binary_output_is_what_post_embed_sends_for_binary(
    client: httpx.Client, tiny_model_dir: Path, corpus: Path, tmp_path: Path
) -> None:
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--encoding", "binary") == EXIT_OK
    table = shards(tmp_path / "out")
    values = embeddings(table)
    assert values.dtype == np.int8 and values.shape[1] == 64 // 8
    floats = client.post("/embed", json={"inputs": TEXTS}).json()
    assert_same_bits(values, floats, signed=True)


def test_the_zhembed_command_runs_each_stage_importing_only_it() -> None:
    code = (
        "import sys\nfrom app.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
        "print(sorted(m for m in ('torch', 'fastapi', 'pyarrow', 'ray') if m in sys.modules))\nsys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )

    bulk = run("bulk", "--help")
    assert bulk.returncode == 0 and "--text-field" in bulk.stdout
    assert bulk.stdout.strip().splitlines()[-1] == "['pyarrow']"  # no torch, no FastAPI, no Ray for --help
    serve = run("serve", "--help")
    assert serve.returncode == 0 and "--max-batch-size" in serve.stdout
    assert serve.stdout.strip().splitlines()[-1] == "['fastapi']"
    unknown = run("nope")
    assert unknown.returncode == 2 and "no command 'nope'" in unknown.stderr
