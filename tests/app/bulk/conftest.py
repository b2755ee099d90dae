"""Helpers for the bulk job's tests: corpora written in each format, the job run in-process on the tiny
exported model (fp32, one thread: the variant the test server runs), and its output read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.bulk.cli import main

# Texts of many lengths, a few repeated (each is embedded once per call and written once per row).
TEXTS = [f"第{i}句：今天天气很好，我们去公园散步吧。" * (1 + i % 3) for i in range(40)] + [
    "你好",
    "你好",
    "北京",
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def run_bulk(model: Path, corpus: Path, out: Path, *flags: str) -> int:
    """``python -m app.bulk`` in this process on ``model`` (fp32, one thread): its exit status."""
    model_flags = ["--model", str(model), "--variant", "fp32", "--intra-op-threads", "1"]
    return main([*model_flags, "--input", str(corpus), "--output", str(out), "--progress", "off", *flags])


def shards(out: Path) -> pa.Table:
    """Every shard of ``out`` in name order, as one table (rows in the order written)."""
    parts = sorted(out.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts])


def embeddings(table: pa.Table) -> np.ndarray:
    """The embedding column of ``table`` as one [rows, width] array, in its own type."""
    return np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(table.num_rows, -1)


def vectors(out: Path) -> dict[str, np.ndarray]:
    """id → vector of everything in ``out`` (every id once: checked)."""
    t = shards(out)
    ids = t.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id is written twice"
    matrix = embeddings(t)
    return dict(zip(ids, matrix, strict=True))


def errors(out: Path) -> list[dict[str, str]]:
    return [orjson.loads(line) for line in (out / "_errors.jsonl").read_bytes().splitlines()]


def manifest(out: Path) -> dict[str, Any]:
    return orjson.loads((out / "_manifest.json").read_bytes())


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in TEXTS])
