"""The bulk job's sparse column (``--sparse``, ``--sparse-only``, ``--sparse-top-k``): every row's weights
equal ``POST /embed_sparse``'s for its text, beside the dense vectors or instead of them, and a model
without the sparse graph, or options that cannot apply, are one line before any row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from app.bulk.cli import EXIT_CANNOT_RUN, EXIT_OK, EXIT_SKIPPED
from app.bulk.output import SPARSE_TYPE
from tests.app.bulk.conftest import TEXTS, manifest, run_bulk, shards, vectors, write_jsonl
from tests.app.conftest import Running, serve_model


@pytest.fixture(scope="module")
def sparse_client(tiny_sparse_dir: Path) -> Iterator[httpx.Client]:
    for running in serve_model(tiny_sparse_dir):
        yield from _client(running)


def _client(running: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client


def served(client: httpx.Client, texts: list[str], **body: object) -> list[dict[int, float]]:
    """``/embed_sparse``'s answer for ``texts``, each as index → weight."""
    answer = client.post("/embed_sparse", json={"inputs": texts, **body})
    assert answer.status_code == 200, answer.text
    return [{int(e["index"]): float(e["value"]) for e in row} for row in answer.json()]


def written(table: pa.Table) -> dict[str, dict[int, float]]:
    """id → index → weight of a shard table's sparse column (indices ascending: checked)."""
    out: dict[str, dict[int, float]] = {}
    for row_id, entries in zip(
        table.column("id").to_pylist(), table.column("sparse").to_pylist(), strict=True
    ):
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices) and all(e["value"] > 0 for e in entries)
        out[row_id] = {int(e["index"]): float(e["value"]) for e in entries}
    return out


def assert_same_weights(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    a = np.array([got[i] for i in sorted(want)], np.float32)
    b = np.array([want[i] for i in sorted(want)], np.float32)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # one variant, batched apart


def test_sparse_beside_the_dense_vectors_equals_embed_sparse_for_every_row(
    sparse_client: httpx.Client, tiny_sparse_dir: Path, tmp_path: Path
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(TEXTS)])
    assert run_bulk(tiny_sparse_dir, corpus, tmp_path / "both", "--id-field", "id", "--sparse") == EXIT_OK
    table = shards(tmp_path / "both")
    assert table.column_names == ["id", "embedding", "sparse", "tokens"]
    assert table.schema.field("sparse").type == SPARSE_TYPE
    rows = written(table)
    for i, want in enumerate(served(sparse_client, TEXTS)):
        assert_same_weights(rows[str(i)], want)
    dense = vectors(tmp_path / "both")
    answer = sparse_client.post("/embed", json={"inputs": TEXTS}).json()
    for i, want in enumerate(answer):
        np.testing.assert_allclose(dense[str(i)], want, atol=1e-5)
    assert manifest(tmp_path / "both")["sparse"] == {"mode": "beside", "top_k": None}


def test_sparse_only_with_top_k_writes_no_dense_column_and_the_k_largest(
    sparse_client: httpx.Client, tiny_sparse_dir: Path, tmp_path: Path
) -> None:
    texts = [*TEXTS[:6], ""]  # the empty row is skipped with the API's message
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "only"
    flags = ("--id-field", "id", "--sparse-only", "--sparse-top-k", "5")
    assert run_bulk(tiny_sparse_dir, corpus, out, *flags) == EXIT_SKIPPED
    table = shards(out)
    assert table.column_names == ["id", "sparse", "tokens"]
    rows = written(table)
    assert sorted(rows, key=int) == [str(i) for i in range(6)]
    for i, want in enumerate(served(sparse_client, texts[:6], top_k=5)):
        assert len(rows[str(i)]) == min(5, len(want))
        assert_same_weights(rows[str(i)], want)
    tokens = sparse_client.post("/tokenize", json={"inputs": texts[:6]}).json()
    assert table.column("tokens").to_pylist() == [len(t) for t in tokens]


def test_a_model_without_the_sparse_graph_is_one_line_before_any_row(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS[:3]])
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--sparse") == EXIT_CANNOT_RUN
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has no sparse (SPLADE) output" in line and "--sparse max" in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("part-*"))


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--sparse-top-k", "3"), "--sparse-top-k needs --sparse or --sparse-only"),
        (("--sparse", "--sparse-top-k", "0"), "top_k must be at least 1"),
        (("--sparse", "--long-text", "chunk"), "sparse vectors are not averaged over windows"),
        (("--sparse-only", "--pooling", "cls"), "--pooling: dense-vector options"),
    ],
)
def test_options_that_cannot_apply_are_refused_before_any_row(
    tiny_sparse_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    says: str,
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS[:3]])
    assert run_bulk(tiny_sparse_dir, corpus, tmp_path / "out", *flags) == EXIT_CANNOT_RUN
    assert says in capsys.readouterr().err.strip().splitlines()[-1]
    assert not any((tmp_path / "out").glob("part-*"))
