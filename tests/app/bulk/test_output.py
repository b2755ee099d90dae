"""The output folder: a shard is visible only whole, with its bad rows saved first; the columns read
back with pyarrow and pandas; int8 is the API's int8; another job's folder is told apart in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from app.api.encoding import binary_vectors, encode_vectors
from app.bulk.output import ERRORS, MANIFEST, OutputDir, ShardWriter, mismatch, schema, table
from tests.app.bulk.conftest import embeddings


def test_a_shard_is_invisible_until_committed_and_then_holds_its_rows(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, 3, width=4, encoding="float")
    vectors = np.arange(8, dtype=np.float32).reshape(2, 4)
    writer.add(["a", "b"], vectors, np.array([3, 4]))
    writer.errors.append(("c", "text is empty"))
    assert not list(OutputDir(tmp_path).shards())
    writer.commit()
    assert [i for i, _ in OutputDir(tmp_path).shards()] == [3]
    got = pq.read_table(tmp_path / "part-00003.parquet")
    assert got.schema == schema(4, "float")
    assert got.column("id").to_pylist() == ["a", "b"]
    assert np.array_equal(embeddings(got), vectors)
    assert got.column("tokens").to_pylist() == [3, 4]
    assert OutputDir(tmp_path).shard_errors(3) == b'{"id":"c","error":"text is empty"}\n'
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_aborted_shard_and_what_a_crash_left_are_removed(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, 0, width=2, encoding="float")
    writer.add(["a"], np.ones((1, 2), np.float32), np.array([2]))
    assert (tmp_path / ".part-00000.parquet.tmp").exists()
    writer.abort()
    assert not (tmp_path / ".part-00000.parquet.tmp").exists()
    # A crash between saving a shard's bad rows and its rename: the rows go, the shard is redone.
    crashed = ShardWriter(tmp_path, 1, width=2, encoding="float")
    crashed.add(["b"], np.ones((1, 2), np.float32), np.array([2]))
    (tmp_path / "_bulk").mkdir()
    (tmp_path / "_bulk" / "part-00001.errors.jsonl").write_bytes(b'{"id":"x","error":"e"}\n')
    OutputDir(tmp_path).clean_partial()
    assert not (tmp_path / ".part-00001.parquet.tmp").exists()
    assert not (tmp_path / "_bulk" / "part-00001.errors.jsonl").exists()


def test_the_folder_reads_as_one_dataset_with_pyarrow_and_pandas(tmp_path: Path) -> None:
    for index in range(2):
        writer = ShardWriter(tmp_path, index, width=3, encoding="int8")
        writer.add([f"{index}-a", f"{index}-b"], np.ones((2, 3), np.float32) * (index + 1), np.array([5, 6]))
        writer.commit()
    done = OutputDir(tmp_path).finish({"status": "running"})
    assert done["counts"] == {"rows": 4, "embedded": 4, "skipped": 0, "tokens": 22, "shards": 2}
    assert (
        (tmp_path / ERRORS).exists() and (tmp_path / MANIFEST).exists() and not (tmp_path / "_bulk").exists()
    )
    assert ds.dataset(tmp_path, format="parquet").to_table().num_rows == 4
    frame = pd.read_parquet(tmp_path)
    assert sorted(frame["id"]) == ["0-a", "0-b", "1-a", "1-b"] and list(frame.columns) == [
        "id",
        "embedding",
        "scale",
        "tokens",
    ]


def test_int8_columns_are_the_apis_int8_encoding() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5, 16)).astype(np.float32)
    vectors[2] = 0
    got = table([str(i) for i in range(5)], vectors, np.arange(5), "int8")
    values = embeddings(got)
    wire: list[Any] = list(encode_vectors(vectors, "int8"))
    assert values.dtype == np.int8
    assert np.array_equal(values, np.stack([w["values"] for w in wire]))
    assert got.column("scale").to_pylist() == [w["scale"] for w in wire]


def test_binary_columns_are_the_packed_signs_and_read_back_as_bytes(tmp_path: Path) -> None:
    from sentence_transformers import quantize_embeddings

    vectors = np.random.default_rng(1).standard_normal((6, 20)).astype(np.float32)  # 20 bits: 3 bytes
    pairs: tuple[tuple[Literal["binary", "ubinary"], type[np.generic]], ...] = (
        ("ubinary", np.uint8),
        ("binary", np.int8),
    )
    for encoding, item in pairs:
        got = table([str(i) for i in range(6)], vectors, np.arange(6), encoding)
        assert got.schema == schema(20, encoding) and got.column_names == ["id", "embedding", "tokens"]
        values = embeddings(got)
        assert values.dtype == item
        assert values.tobytes() == quantize_embeddings(vectors, precision=encoding).tobytes()
        assert values.tobytes() == binary_vectors(vectors, signed=encoding == "binary").tobytes()
        (tmp_path / encoding).mkdir()
        writer = ShardWriter(tmp_path / encoding, 0, width=20, encoding=encoding)
        writer.add([str(i) for i in range(6)], vectors, np.arange(6))
        writer.commit()
        back = pd.read_parquet(tmp_path / encoding)
        assert np.array_equal(np.stack(back["embedding"].to_list()), values)


def test_a_different_job_is_told_apart_by_its_first_difference() -> None:
    base: dict[str, Any] = {
        "model": {"digest": "aa", "variant": "int8", "source": "x"},
        "options": {"pooling": "mean", "layers": None},
        "encoding": "float",
        "input": {"text_field": "text"},
        "shard_rows": 10,
        "started": "yesterday",
    }
    # Another start, the same model named another way: the same job.
    assert mismatch(base, {**base, "started": "today", "model": {**base["model"], "source": "y"}}) is None
    assert mismatch(base, {**base, "model": {"digest": "bb", "variant": "int8"}}) == (
        "another model (digest aa, variant int8 there; digest bb, variant int8 here)"
    )
    assert mismatch(base, {**base, "options": {"pooling": "cls", "layers": None}}) == (
        'other options (pooling: "mean" there, "cls" here)'
    )
    assert mismatch(base, {**base, "encoding": "int8"}) == 'another encoding ("float" there, "int8" here)'
