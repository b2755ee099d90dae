"""The single-machine job: the input read as a stream, embedded on the service's engine, written as
shards; run again, it continues where it stopped.

Shard k holds input rows [k × shard_rows, (k + 1) × shard_rows) (bad rows counted, not written), so
which rows a shard holds depends on the input alone: a rerun skips the rows of the shards that are
there and embeds the rest, and the finished folder equals an uninterrupted run's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.bulk.embedder import Embedder
from app.bulk.output import OutputDir, ShardWriter, SparseMode, mismatch, model_entry, now
from app.bulk.progress import Progress
from app.bulk.sources import Fields, InputFile, Rows, count_rows, read
from app.errors import InternalError


class Refused(Exception):
    """The output folder holds another job (or one this run cannot continue): one line, exit status 2."""


@dataclass(frozen=True)
class BulkSpec:
    """What one run reads and writes."""

    files: list[InputFile]
    fields: Fields
    output: Path
    shard_rows: int
    encoding: str
    input_spec: str  # --input as given
    format: str | None  # --format, None: by file names
    sparse: SparseMode = "off"  # --sparse: "beside"; --sparse-only: "only"
    top_k: int | None = None  # --sparse-top-k


def manifest_of(job: BulkSpec, embedder: Embedder, source: str) -> dict[str, Any]:
    """The manifest of ``job`` run with ``embedder`` (``source``: the model as given), before counts."""
    model = embedder.model
    return {
        "model": {
            **model_entry(embedder.settings, model.manifest, model.variant, source),
            "width": embedder.width,
        },
        # Every EmbedOptions field, resolved against the model's defaults: what the cache keys hold.
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(embedder.options).items()},
        "encoding": job.encoding,
        "sparse": None if job.sparse == "off" else {"mode": job.sparse, "top_k": job.top_k},
        "input": {
            "input": job.input_spec,
            "format": job.format,
            "text_field": job.fields.text,
            "id_field": job.fields.id,
            "files": [_file_entry(f) for f in job.files],
        },
        "shard_rows": job.shard_rows,
        "status": "running",
        "started": now(),
        "finished": None,
        "runs": 1,
        "counts": None,
    }


def _file_entry(f: InputFile) -> dict[str, Any]:
    stat = f.path.stat()
    return {"name": f.name, "format": f.format, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def prepare(
    out: OutputDir, manifest: dict[str, Any], overwrite: bool, can_resume: bool = True
) -> tuple[str, dict[str, Any]]:
    """Decide what this run does in ``out``: "fresh", "resume" or "done" (nothing left), and the manifest
    it goes on with.

    Raises:
        Refused: the folder holds another job's output (or one that ``can_resume`` False cannot finish),
            and ``overwrite`` is off.
    """
    where = out.folder
    if overwrite:
        out.clear()
        return "fresh", manifest
    old = out.manifest()
    if old is None:
        if out.has_output():
            raise Refused(
                f"{where} holds shards but no _manifest.json, so what made them is unknown: rerun with "
                "--overwrite to replace them, or choose another --output"
            )
        return "fresh", manifest
    reason = mismatch(old, manifest)
    if reason is not None:
        raise Refused(
            f"{where} holds embeddings of {reason}: rerun with --overwrite to replace them, or choose another --output"
        )
    if old.get("status") == "done":
        return "done", old
    if not can_resume:
        raise Refused(
            f"{where} holds an unfinished run of this job, which the Ray path cannot continue: finish it "
            "without --ray, or rerun with --overwrite"
        )
    return "resume", {**manifest, "started": old.get("started"), "runs": int(old.get("runs", 1)) + 1}


def pieces(job: BulkSpec, skip: set[int]) -> Iterator[tuple[int, Rows]]:
    """The input's rows in order as (shard index, rows of that shard), leaving out the shards in ``skip``
    (their rows are read, not embedded: which rows a shard holds is a matter of counting)."""
    size = job.shard_rows
    row = 0
    for file in job.files:
        for block in read(file, job.fields):
            start = 0
            while start < len(block):
                shard = row // size
                take = min((shard + 1) * size - row, len(block) - start)
                if shard not in skip:
                    yield shard, block.slice(start, start + take) if take < len(block) else block
                row += take
                start += take


async def run_local(
    job: BulkSpec, embedder: Embedder, manifest: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    """Embed what ``job`` has left to do into its folder, then finish the folder.

    Returns:
        The manifest written, with the counts.

    Raises:
        InputError: an input file cannot be read (the shards finished before it stay).
    """
    out = OutputDir(job.output)
    job.output.mkdir(parents=True, exist_ok=True)
    out.clean_partial()
    out.write_manifest(manifest)
    done = {index for index, _ in out.shards()}
    if done:
        progress.resumed(out.counts()["rows"])
    threading.Thread(target=lambda: progress.set_total(count_rows(job.files)), daemon=True).start()
    writer: ShardWriter | None = None
    try:
        async for shard, rows, answer in embedder.stream(pieces(job, done)):
            if writer is not None and writer.index != shard:
                raise InternalError(f"shard {shard} began before shard {writer.index} had all its rows")
            if writer is None:
                writer = ShardWriter(job.output, shard, embedder.width, job.encoding, job.sparse)
            keep = answer.keep
            writer.add([rows.ids[i] for i in keep], answer.vectors, answer.tokens, answer.sparse)
            writer.errors.extend((rows.ids[i], message) for i, message in sorted(answer.bad.items()))
            writer.seen += len(rows)
            progress.update(len(rows), len(keep), int(np.sum(answer.tokens, dtype=np.int64)))
            if writer.seen == job.shard_rows:  # whole: visible now, not when the next row turns up
                writer.commit()
                writer = None
        if writer is not None:
            writer.commit()
            writer = None
    finally:
        if writer is not None:
            writer.abort()
    return out.finish(manifest)
