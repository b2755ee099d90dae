"""The job's output folder: Parquet shards that appear only whole, the manifest, and the bad rows.

::

    DIR/part-00000.parquet …  id (string), embedding (fixed-size list of float32 [width]; with
                              --encoding int8 of int8, plus scale (float64): vector ≈ embedding × scale;
                              with ubinary / binary of uint8 / int8 [ceil(width / 8)], the packed signs),
                              with --sparse also sparse (list of struct index int32, value float32: the
                              non-zero weights, as POST /embed_sparse; --sparse-only: no embedding),
                              tokens (int32); rows in input order, shard k holding input rows
                              [k × shard_rows, (k + 1) × shard_rows) less the bad ones
    DIR/_manifest.json        what made them (model digest as in the cache keys, variant, options,
                              input, encoding), the counts, when it started and finished
    DIR/_errors.jsonl         one line per bad row: {"id": ..., "error": the API's message}
    DIR/_bulk/                while the job runs: each finished shard's bad rows

A shard is written as ``.part-NNNNN.parquet.tmp`` and renamed once complete (its bad rows saved first),
so a shard that is there is whole, and a crash at any moment loses at most the shard being written.
Everything that is not a shard starts with ``_`` or ``.``, which pyarrow's dataset discovery skips:
``pandas.read_parquet(DIR)`` and ``pyarrow.dataset.dataset(DIR)`` read the shards and nothing else (a
plain ``errors.jsonl`` beside them would make both fail).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from app.api.encoding import binary_vectors, int8_vectors
from app.cache.keys import model_digest
from app.model.manifest import Manifest
from app.settings import Settings
from app.tasks.sparse import SparseVector

MANIFEST = "_manifest.json"
ERRORS = "_errors.jsonl"
STATE = "_bulk"
SHARD = re.compile(r"^part-(\d{5,})\.parquet$")
# Rows per Parquet row group: readers fetch a group at a time; ~25 MB of 768-wide float32 vectors.
ROW_GROUP_ROWS = 8192
# What identifies a job: a rerun into the same folder continues it only if all of these match.
IDENTITY = ("model", "options", "encoding", "sparse", "input", "shard_rows")
MODEL_IDENTITY = ("digest", "variant")  # the graph file and tokenizer, and which variant of it


# --sparse: the sparse column "beside" the dense one, "only" it, or none ("off").
SparseMode = Literal["off", "beside", "only"]
SPARSE_TYPE = pa.list_(pa.struct([pa.field("index", pa.int32()), pa.field("value", pa.float32())]))


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def embedding_type(width: int, encoding: str) -> pa.DataType:
    """The embedding column of vectors ``width`` wide: ``width`` float32 or int8 a row, or for the
    bit-packed encodings ``ceil(width / 8)`` uint8 (ubinary) or int8 (binary)."""
    if encoding in ("binary", "ubinary"):
        return pa.list_(pa.int8() if encoding == "binary" else pa.uint8(), -(-width // 8))
    return pa.list_(pa.int8() if encoding == "int8" else pa.float32(), width)


def schema(width: int, encoding: str, sparse: SparseMode = "off") -> pa.Schema:
    """The shards' columns (the same from the single-machine job and from Ray): with ``sparse`` "beside"
    a ``sparse`` column after the dense one, with "only" instead of it."""
    columns = [pa.field("id", pa.string(), nullable=False)]
    if sparse != "only":
        columns.append(pa.field("embedding", embedding_type(width, encoding), nullable=False))
        if encoding == "int8":
            columns.append(pa.field("scale", pa.float64(), nullable=False))
    if sparse != "off":
        columns.append(pa.field("sparse", SPARSE_TYPE, nullable=False))
    return pa.schema([*columns, pa.field("tokens", pa.int32(), nullable=False)])


def sparse_column(vectors: list[SparseVector]) -> pa.Array:
    """``vectors`` as the ``sparse`` column: per row its non-zero weights as (index, value), index order."""
    offsets = np.zeros(len(vectors) + 1, np.int32)
    np.cumsum([len(v.indices) for v in vectors], out=offsets[1:])
    indices = np.concatenate([v.indices for v in vectors]) if vectors else np.empty(0, np.int32)
    values = np.concatenate([v.values for v in vectors]) if vectors else np.empty(0, np.float32)
    entries = pa.StructArray.from_arrays(
        [pa.array(indices.astype(np.int32, copy=False)), pa.array(values.astype(np.float32, copy=False))],
        fields=list(SPARSE_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=SPARSE_TYPE)


def table(
    ids: list[str],
    vectors: np.ndarray,
    tokens: np.ndarray,
    encoding: str,
    sparse: list[SparseVector] | None = None,
    mode: SparseMode = "off",
) -> pa.Table:
    """Rows of the shard schema from ``ids``, float32 ``vectors`` [n, width] and ``tokens`` [n]; with
    ``encoding`` int8, ubinary or binary, the vectors as the API's encoding of that name gives them (int8:
    values and a scale); with ``mode`` "beside" or "only", the rows' ``sparse`` vectors (with "only" the
    dense ``vectors`` are not written: [n, 0] will do)."""
    width = vectors.shape[1]
    columns: dict[str, pa.Array] = {"id": pa.array(ids, pa.string())}
    if mode != "only":
        if encoding == "int8":
            values, scales = int8_vectors(vectors)
            columns["scale"] = pa.array(scales, pa.float64())
        elif encoding in ("binary", "ubinary"):
            values = binary_vectors(vectors, signed=encoding == "binary")
        else:
            values = np.ascontiguousarray(vectors, dtype=np.float32)
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(
            pa.array(values.reshape(-1)), values.shape[1]
        )
    if mode != "off":
        if sparse is None or len(sparse) != len(ids):
            raise ValueError(f"sparse {mode!r} needs a sparse vector per row")
        columns["sparse"] = sparse_column(sparse)
    columns["tokens"] = pa.array(tokens.astype(np.int32, copy=False))
    return pa.Table.from_pydict(columns, schema=schema(width, encoding, mode))


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary name and a rename: the file is whole or absent."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def error_lines(errors: list[tuple[str, str]]) -> bytes:
    return b"".join(orjson.dumps({"id": row_id, "error": message}) + b"\n" for row_id, message in errors)


class ShardWriter:
    """One shard on its way: row groups into ``.part-NNNNN.parquet.tmp``, renamed on :meth:`commit`."""

    def __init__(
        self, folder: Path, index: int, width: int, encoding: str, sparse: SparseMode = "off"
    ) -> None:
        self.folder = folder
        self.index = index
        self.encoding = encoding
        self.sparse = sparse
        self.path = folder / shard_name(index)
        self.tmp = folder / f".{self.path.name}.tmp"
        self._writer = pq.ParquetWriter(
            self.tmp, schema(width, encoding, sparse), compression="snappy", use_dictionary=["id"]
        )
        self._parts: list[tuple[list[str], np.ndarray, np.ndarray, list[SparseVector]]] = []
        self._buffered = 0
        self.errors: list[tuple[str, str]] = []
        self.rows = 0  # rows written
        self.seen = 0  # input rows of the shard handled, bad ones included (the caller counts)

    def add(
        self,
        ids: list[str],
        vectors: np.ndarray,
        tokens: np.ndarray,
        sparse: list[SparseVector] | None = None,
    ) -> None:
        if ids:
            self._parts.append((ids, vectors, tokens, sparse or []))
            self._buffered += len(ids)
            self.rows += len(ids)
        if self._buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._parts:
            return
        ids = [i for part in self._parts for i in part[0]]
        vectors = np.concatenate([part[1] for part in self._parts])
        tokens = np.concatenate([part[2] for part in self._parts])
        sparse = [v for part in self._parts for v in part[3]]
        rows = table(ids, vectors, tokens, self.encoding, sparse, self.sparse)
        self._writer.write_table(rows, row_group_size=len(ids))
        self._parts, self._buffered = [], 0

    def commit(self) -> None:
        """Finish the file, save the shard's bad rows, then make the shard visible (in that order: a
        visible shard always has its bad rows saved)."""
        self._flush()
        self._writer.close()
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        state = self.folder / STATE
        state.mkdir(exist_ok=True)
        write_atomic(state / f"part-{self.index:05d}.errors.jsonl", error_lines(self.errors))
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._writer.close()
        self.tmp.unlink(missing_ok=True)


class OutputDir:
    """``DIR`` and what a job there has done so far."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def manifest(self) -> dict[str, Any] | None:
        path = self.folder / MANIFEST
        if not path.is_file():
            return None
        try:
            found = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            return None
        return found if isinstance(found, dict) else None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_atomic(self.folder / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")

    def has_output(self) -> bool:
        """Whether the folder holds anything of a job (a manifest or shards)."""
        return (self.folder / MANIFEST).exists() or any(self.shards())

    def shards(self) -> Iterator[tuple[int, Path]]:
        """The complete shards: (index, path), in index order."""
        if not self.folder.is_dir():
            return
        found = sorted((int(m.group(1)), p) for p in self.folder.iterdir() if (m := SHARD.match(p.name)))
        yield from found

    def clear(self) -> None:
        """Remove everything a job left here (``--overwrite``); nothing else in the folder is touched."""
        for _, path in list(self.shards()):
            path.unlink()
        for name in (MANIFEST, ERRORS):
            (self.folder / name).unlink(missing_ok=True)
        self.clean_partial()
        shutil.rmtree(self.folder / STATE, ignore_errors=True)

    def clean_partial(self) -> None:
        """Remove what an interrupted run left: shards and files that never got their rename, and the bad
        rows of shards that were not finished."""
        if not self.folder.is_dir():
            return
        for p in self.folder.iterdir():
            if (
                p.name.startswith(".part-")
                or p.name.startswith("_ray-")
                or p.name in (f".{MANIFEST}.tmp", f".{ERRORS}.tmp")
            ):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        done = {index for index, _ in self.shards()}
        state = self.folder / STATE
        if state.is_dir():
            for p in state.iterdir():
                m = re.match(r"^part-(\d+)\.errors\.jsonl$", p.name)
                if m is None or int(m.group(1)) not in done:
                    p.unlink()

    def shard_errors(self, index: int) -> bytes:
        path = self.folder / STATE / f"part-{index:05d}.errors.jsonl"
        return path.read_bytes() if path.is_file() else b""

    def counts(self, skipped: int | None = None) -> dict[str, int]:
        """What the complete shards hold: rows embedded and skipped (``skipped``: counted elsewhere), their
        tokens, the shards."""
        embedded = tokens = shards = 0
        bad = 0
        for index, path in self.shards():
            shards += 1
            embedded += pq.ParquetFile(path).metadata.num_rows
            tokens += int(np.asarray(pq.read_table(path, columns=["tokens"]).column(0)).sum(dtype=np.int64))
            bad += self.shard_errors(index).count(b"\n") if skipped is None else 0
        bad = bad if skipped is None else skipped
        return {
            "rows": embedded + bad,
            "embedded": embedded,
            "skipped": bad,
            "tokens": tokens,
            "shards": shards,
        }

    def finish(self, manifest: dict[str, Any], errors: bytes | None = None) -> dict[str, Any]:
        """Gather the bad rows into ``_errors.jsonl`` (the shards' own, or ``errors`` as given), write the
        manifest as done, drop the state.

        Returns:
            The manifest written.
        """
        if errors is None:
            errors = b"".join(self.shard_errors(index) for index, _ in self.shards())
        write_atomic(self.folder / ERRORS, errors)
        counts = self.counts(skipped=errors.count(b"\n"))
        done = {**manifest, "status": "done", "counts": counts, "finished": now()}
        self.write_manifest(done)
        shutil.rmtree(self.folder / STATE, ignore_errors=True)
        return done


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def model_entry(settings: Settings, manifest: Manifest, variant: str, source: str) -> dict[str, Any]:
    """The model part of a job's identity, as the service names it (its cache digest and served name),
    from the manifest alone (a Ray driver loads no model to write it). What :func:`mismatch` compares."""
    return {
        "digest": model_digest(manifest, variant),
        "variant": variant,
        "name": settings.served_model_name or manifest.source.name(),
        "source": source,
    }


def mismatch(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why a job described by ``new`` may not continue the one ``old`` describes (None: it may): the first
    part of the identity that differs, and how."""
    for key in IDENTITY:
        a, b = old.get(key), new.get(key)
        if key == "model":  # the model itself, however --model named it
            a, b = (tuple(_get(m, k) for k in MODEL_IDENTITY) for m in (a, b))
        if a == b:
            continue
        if key == "model":
            a, b = old.get(key), new.get(key)
            return (
                f"another model (digest {_get(a, 'digest')}, variant {_get(a, 'variant')} there; "
                f"digest {_get(b, 'digest')}, variant {_get(b, 'variant')} here)"
            )
        if isinstance(a, dict) and isinstance(b, dict):
            field = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            return f"other {key} ({field}: {_short(a.get(field))} there, {_short(b.get(field))} here)"
        return f"another {key} ({_short(a)} there, {_short(b)} here)"
    return None


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 80 else text[:77] + "..."
