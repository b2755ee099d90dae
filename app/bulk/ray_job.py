"""The same job on Ray Data, past one machine: ``read_datasource`` → ``map_batches`` with an actor class
→ ``write_parquet``, then one commit on the driver.

- **Reading**: :class:`CorpusDatasource` makes the job's own readers (:mod:`app.bulk.sources`) Ray read
  tasks, one per input file, so ids (``FILE:LINE``) and bad rows are exactly the single-machine job's
  (Ray's ``read_json`` / ``read_csv`` / ``read_text`` infer column types per block and know no line
  numbers).
- **Embedding**: :class:`EmbedBatch` is Ray Data's batch-inference pattern: ``__init__`` builds the
  :class:`~app.bulk.embedder.Embedder` (model, engine, service) once per actor, ``__call__`` maps a
  batch (a pyarrow Table of id, text, error) to rows of the shard schema with the same batching and
  pooling code as the single-machine job. ``--ray-actors`` is ``concurrency``; ``--ray-cpus`` and
  ``--ray-gpus`` are each actor's ``num_cpus`` / ``num_gpus``.
- **Writing**: ``write_parquet`` into a staging folder ``DIR/_ray-<id>/``; once the whole dataset is
  written, the driver renames the files into ``DIR/part-NNNNN.parquet``, gathers the bad rows into
  ``DIR/_errors.jsonl`` and writes the manifest. Nothing is visible in ``DIR`` before the job finished;
  a failed job leaves only staging, which the next run removes.

Retries: Ray restarts an actor whose worker died and runs its task again (Ray Data's actor pools retry
without limit by default), and a task's output counts only once the task has finished, so a killed
worker costs its batch and duplicates nothing. A batch's bad rows go to a file named after the batch's
rows, written whole, so a retried batch rewrites the same file; the commit keeps each id once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from app.bulk.embedder import Embedder
from app.bulk.output import OutputDir, SparseMode, error_lines, schema, shard_name, table, write_atomic
from app.bulk.runner import BulkSpec, manifest_of, prepare
from app.bulk.sources import Fields, InputFile, Rows, read
from app.model.runtime import check_model
from app.settings import Settings
from app.tasks.sparse import SparseVector

# The read blocks' columns: each row's id, its text (null for a bad row) and why it is bad (null if not).
READ_SCHEMA = pa.schema(
    [pa.field("id", pa.string()), pa.field("text", pa.string()), pa.field("error", pa.string())]
)


def _read_file(file: InputFile, fields: Fields) -> Any:
    for rows in read(file, fields):
        errors = [rows.bad.get(i) for i in range(len(rows))]
        yield pa.Table.from_pydict({"id": rows.ids, "text": rows.texts, "error": errors}, schema=READ_SCHEMA)


def datasource(files: list[InputFile], fields: Fields) -> Any:
    """The input as a Ray Data datasource: one read task per file, the job's own readers in each."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class CorpusDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return sum(f.path.stat().st_size for f in files)

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[Any]:
            return [
                ReadTask(
                    partial(_read_file, f, fields),
                    BlockMetadata(
                        num_rows=None,
                        size_bytes=f.path.stat().st_size,
                        input_files=(str(f.path),),
                        exec_stats=None,
                    ),
                    schema=READ_SCHEMA,
                    per_task_row_limit=per_task_row_limit,
                )
                for f in files
            ]

    return CorpusDatasource()


class EmbedBatch:
    """One Ray actor's model: built once in ``__init__``, a batch mapped per ``__call__``."""

    def __init__(
        self,
        settings: Settings,
        given: dict[str, Any],
        text_field: str,
        window: int,
        encoding: str,
        errors_dir: str,
        sparse: SparseMode = "off",
        top_k: int | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.embedder = Embedder(settings, given, text_field, window, sparse=sparse, top_k=top_k)
        self.loop.run_until_complete(self.embedder.check())  # and the width of an all-bad batch's columns
        self.encoding = encoding
        self.sparse: SparseMode = sparse
        self.errors_dir = Path(errors_dir)

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        errors = batch.column("error").to_pylist()
        rows = Rows(
            ids, batch.column("text").to_pylist(), {i: e for i, e in enumerate(errors) if e is not None}
        )
        kept, vectors, tokens, sparse, bad = self.loop.run_until_complete(self._embed(rows))
        if bad:
            # Named after the batch's rows: a retry of this batch writes the same file.
            name = hashlib.sha256(orjson.dumps([ids[0], ids[-1], len(ids)])).hexdigest()[:24]
            self.errors_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.errors_dir / f"{name}.jsonl", error_lines(bad))
        return table(kept, vectors, tokens, self.encoding, sparse, self.sparse)

    async def _embed(
        self, rows: Rows
    ) -> tuple[list[str], np.ndarray, np.ndarray, list[SparseVector], list[tuple[str, str]]]:
        """The batch's rows through :meth:`Embedder.stream`: the ids kept, their vectors, tokens and
        sparse vectors (with --sparse), and the bad rows with their messages."""
        kept: list[str] = []
        vectors: list[np.ndarray] = []
        tokens: list[np.ndarray] = []
        sparse: list[SparseVector] = []
        bad: list[tuple[str, str]] = []
        async for _, part, answer in self.embedder.stream([(None, rows)]):
            kept.extend(part.ids[i] for i in answer.keep)
            vectors.append(answer.vectors)
            tokens.append(answer.tokens)
            sparse.extend(answer.sparse or [])
            bad.extend((part.ids[i], message) for i, message in sorted(answer.bad.items()))
        width = self.embedder.width
        return (
            kept,
            np.concatenate(vectors) if vectors else np.empty((0, width), np.float32),
            np.concatenate(tokens) if tokens else np.empty(0, np.int32),
            sparse,
            bad,
        )


def run_ray(
    job: BulkSpec, settings: Settings, given: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Run ``job`` on Ray Data (``args.ray``: "local" for ``ray.init()``, else the cluster's address).

    Returns:
        The manifest written.
    """
    settings, manifest, state = prepare_ray(job, settings, given, args)
    if state == "done":
        return manifest
    return execute(job, settings, given, args, manifest)


def prepare_ray(
    job: BulkSpec, settings: Settings, given: dict[str, Any], args: argparse.Namespace
) -> tuple[Settings, dict[str, Any], str]:
    """On the driver, before any actor starts: resolve the model (exporting it on first use), check the
    options against it, and decide what the run does in the output folder (:func:`~app.bulk.runner.prepare`).

    Returns:
        The settings naming the resolved model folder (which every node must see), the manifest and the state.
    """
    folder, _, _ = check_model(settings)
    source = settings.model  # as given, as a local run records it (not the folder it resolved to)
    settings = settings.model_copy(update={"model": str(folder)})
    embedder = Embedder(settings, given, job.fields.text, args.window, sparse=job.sparse, top_k=job.top_k)
    try:
        asyncio.run(embedder.check())
        manifest = manifest_of(job, embedder, source)
    finally:
        embedder.close()
    manifest["ray"] = {
        "actors": args.ray_actors,
        "cpus_per_actor": args.ray_cpus,
        "gpus_per_actor": args.ray_gpus,
    }
    state, manifest = prepare(OutputDir(job.output), manifest, args.overwrite, can_resume=False)
    return settings, manifest, state


def execute(
    job: BulkSpec,
    settings: Settings,
    given: dict[str, Any],
    args: argparse.Namespace,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """The Ray Data pipeline into a staging folder, then :func:`commit`. Starts a Ray unless one is up."""
    import ray

    out = OutputDir(job.output)
    job.output.mkdir(parents=True, exist_ok=True)
    out.clean_partial()
    staging = job.output / f"_ray-{uuid.uuid4().hex[:12]}"
    started = not ray.is_initialized()
    if started:
        ray.init(
            address=None if args.ray == "local" else args.ray, include_dashboard=False, log_to_driver=False
        )
    try:
        width = int(manifest["model"]["width"])
        ds = ray.data.read_datasource(datasource(job.files, job.fields))
        ds = ds.map_batches(
            EmbedBatch,
            fn_constructor_kwargs={
                "settings": settings,
                "given": given,
                "text_field": job.fields.text,
                "window": args.window,
                "encoding": job.encoding,
                "errors_dir": str(staging / "errors"),
                "sparse": job.sparse,
                "top_k": job.top_k,
            },
            batch_size=args.window,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=args.ray_actors),
            num_cpus=args.ray_cpus,
            num_gpus=args.ray_gpus or None,
        )
        ds.write_parquet(
            str(staging / "parts"),
            schema=schema(width, job.encoding, job.sparse),
            min_rows_per_file=job.shard_rows,
        )
    finally:
        if started:
            ray.shutdown()
    return commit(out, staging, manifest)


def commit(out: OutputDir, staging: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Move a finished Ray run's files from ``staging`` into the folder: the shards (renamed
    ``part-NNNNN.parquet`` in staging's name order), the bad rows (each id once), the manifest."""
    parts = sorted((staging / "parts").glob("*.parquet")) if (staging / "parts").is_dir() else []
    for index, path in enumerate(parts):
        os.replace(path, out.folder / shard_name(index))
    seen: dict[str, str] = {}
    errors_dir = staging / "errors"
    for path in sorted(errors_dir.glob("*.jsonl")) if errors_dir.is_dir() else []:
        for line in path.read_bytes().splitlines():
            entry = orjson.loads(line)
            seen.setdefault(entry["id"], entry["error"])
    bad = error_lines(sorted(seen.items()))
    done = out.finish(manifest, errors=bad)
    shutil.rmtree(staging, ignore_errors=True)
    return done
