"""``--format openai-batch``: an OpenAI batch input file answered into a batch output file
(:mod:`app.bulk.openai_batch`), resumable after a crash or ``kill -9``.

The output holds one line per request line (blank lines are none), in input order. It is only ever
appended to, in chunks of :data:`CHUNK_LINES` lines, each written with one ``write`` and ``fsync``-ed;
a crash can leave a torn last line and nothing else. A rerun cuts the file after its last newline,
counts its lines (N), checks that line N answers the input's N-th request (same custom_id), and answers
the lines after it: every custom_id once, as in an uninterrupted run (whose ids are the same: they are
made from the line's number and custom_id). Beside the output, ``.NAME.zhembed.json`` says which job
wrote it (model, input file with size and mtime) and whether it finished, as the Parquet job's manifest.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from app.bulk.embedder import Embedder
from app.bulk.openai_batch import Answerer, Line, read_lines
from app.bulk.output import mismatch, now, write_atomic
from app.bulk.progress import Progress

log = logging.getLogger("app.bulk")

# Output lines per write + fsync: what a crash can cost at most, and a small cost per line.
CHUNK_LINES = 256
IDENTITY = ("model", "input")
# Bytes read at a time when a rerun counts the lines written (a line may hold megabytes of vectors).
READ_BLOCK = 1 << 22
STATUS_KEY = b'"response":{"status_code":'


def manifest_path(output: Path) -> Path:
    return output.with_name(f".{output.name}.zhembed.json")


def manifest_of(input_path: Path, model: dict[str, Any]) -> dict[str, Any]:
    """What identifies the job (``model`` and ``input``, compared on a rerun), and its state."""
    stat = input_path.stat()
    return {
        "format": "openai-batch",
        "model": model,
        "input": {"path": str(input_path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns},
        "status": "running",
        "started": now(),
        "finished": None,
        "runs": 1,
        "counts": None,
    }


class Refused(Exception):
    """The output holds another job's answers: one line, exit status 2."""


def prepare(output: Path, manifest: dict[str, Any], overwrite: bool) -> tuple[str, dict[str, Any]]:
    """What this run does: "fresh", "resume" or "done", and the manifest it goes on with.

    Raises:
        Refused: ``output`` holds another job's lines (or lines of no known job) and not ``overwrite``.
    """
    side = manifest_path(output)
    if overwrite:
        output.unlink(missing_ok=True)
        side.unlink(missing_ok=True)
        return "fresh", manifest
    old = orjson.loads(side.read_bytes()) if side.exists() else None
    if old is None:
        if output.exists() and output.stat().st_size:
            raise Refused(f"{output} exists and no {side.name} says what wrote it: rerun with --overwrite")
        return "fresh", manifest
    reason = mismatch({k: old.get(k) for k in IDENTITY}, {k: manifest.get(k) for k in IDENTITY})
    if reason is not None:
        raise Refused(
            f"{output} holds answers of {reason}: rerun with --overwrite, or choose another --output"
        )
    if old.get("status") == "done":
        return "done", old
    return "resume", {**manifest, "started": old.get("started"), "runs": int(old.get("runs", 1)) + 1}


def begin(
    input_path: Path, output: Path, model: dict[str, Any], overwrite: bool
) -> tuple[str, dict[str, Any]]:
    """The run's state and manifest (:func:`prepare`), logged: where a local run and a Ray run begin."""
    state, manifest = prepare(output, manifest_of(input_path, model), overwrite)
    if state == "done":
        log.info("%s is complete already (started %s)", output, manifest.get("started"))
    elif state == "resume":
        log.info("continuing the job in %s (run %d)", output, manifest["runs"])
    return state, manifest


def resume(output: Path, manifest: dict[str, Any]) -> tuple[int, Any]:
    """Mark the job running in its manifest and cut ``output`` after its last whole line
    (:func:`written_prefix`): where a local run and a Ray run start answering."""
    done, last_id = written_prefix(output)
    write_atomic(manifest_path(output), orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return done, last_id


def written_prefix(output: Path) -> tuple[int, Any]:
    """Cut ``output`` after its last whole line (a crash may have torn the one after); the number of
    whole lines and the last one's custom_id. Read in blocks: the file may be large."""
    if not output.exists():
        return 0, None
    lines = 0
    ends = [0, 0]  # where the last two whole lines end (0: none)
    with open(output, "r+b") as f:
        offset = 0
        while block := f.read(READ_BLOCK):
            count = block.count(b"\n")
            if count:
                lines += count
                last = offset + block.rfind(b"\n") + 1
                before = block.rfind(b"\n", 0, block.rfind(b"\n")) if count > 1 else -1
                ends = [offset + before + 1 if before >= 0 else ends[1], last]
            offset += len(block)
        if ends[1] < offset:
            f.truncate(ends[1])
            f.flush()
            os.fsync(f.fileno())
        if not lines:
            return 0, None
        f.seek(ends[0])
        last_line = f.read(ends[1] - ends[0])
    return lines, orjson.loads(last_line).get("custom_id")


def todo(lines: Iterator[Line], done: int, last_id: Any, output: Path) -> Iterator[Line]:
    """``lines`` after the first ``done`` (whose answers are written), checking that the last of those
    answers the same request as before.

    Raises:
        Refused: the written lines do not answer this input's first ``done`` requests.
    """
    count = 0
    for count, line in enumerate(lines, 1):
        if count < done:
            continue
        if count == done:
            if line.custom_id != last_id:
                raise Refused(
                    f"{output} line {done} answers custom_id {last_id!r}, but request {done} of the input "
                    f"is {line.custom_id!r}: rerun with --overwrite"
                )
            continue
        yield line
    if done and count < done:
        raise Refused(f"{output} holds {done} lines, but the input has only {count} requests")


class ChunkWriter:
    """Appends output lines in chunks of :data:`CHUNK_LINES`, each one ``write`` and an ``fsync``."""

    def __init__(self, output: Path) -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.chunk: list[bytes] = []

    def add(self, line: bytes) -> None:
        self.chunk.append(line)
        if len(self.chunk) >= CHUNK_LINES:
            self.flush()

    def flush(self) -> None:
        if self.chunk:
            data = b"".join(self.chunk)
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
            os.fsync(self.fd)
            self.chunk.clear()

    def close(self) -> None:
        self.flush()
        os.close(self.fd)


async def answer_in_order(answerer: Answerer, lines: Iterator[Line], window: int) -> Any:
    """Each line's (output line, answered 2xx), in input order, with at most ``window`` inputs of the
    lines in flight at once (the engine batches them across lines, by length)."""
    pending: deque[tuple[int, asyncio.Future[tuple[bytes, bool]]]] = deque()
    queued = 0
    try:
        for line in lines:
            # Room first: the engine admits window + a margin of inputs (engine_settings), never more.
            while pending and queued + line.inputs > window:
                inputs, future = pending.popleft()
                queued -= inputs
                yield await future
            pending.append((line.inputs, asyncio.ensure_future(answerer.answer(line))))
            queued += line.inputs
        while pending:
            _, future = pending.popleft()
            yield await future
    finally:
        for _, future in pending:
            future.cancel()


async def run_local(
    input_path: Path, output: Path, embedder: Embedder, manifest: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    """Answer the lines of ``input_path`` not yet in ``output``, then mark the job done.

    Returns:
        The manifest written, with the counts.

    Raises:
        JobFault: a line answered 429 or 5xx (the lines before it stay written).
        Refused: ``output`` does not answer this input's first lines.
    """
    done, last_id = resume(output, manifest)
    if done:
        progress.resumed(done)
    answerer = Answerer(embedder.service)
    lines = todo(read_lines(input_path, answerer.routes), done, last_id, output)
    writer = ChunkWriter(output)
    try:
        async for line, ok in answer_in_order(answerer, lines, embedder.window):
            writer.add(line)
            progress.update(1, int(ok), 0)
    finally:
        writer.close()
    return finish(output, manifest)


def finish(output: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Count ``output``'s answers by status and mark the job done in its manifest."""
    lines = failed = 0
    with open(output, "rb") as f:
        for raw in f:
            lines += 1
            failed += _status(raw) // 100 != 2
    manifest = {**manifest, "status": "done", "finished": now()}
    manifest["counts"] = {"lines": lines, "answered": lines - failed, "failed": failed}
    write_atomic(manifest_path(output), orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest


def _status(raw: bytes) -> int:
    """An output line's status_code, found without reading its body: the first ``"response":...`` of the
    line is the record's own (its quotes would be escaped inside the custom_id string before it)."""
    at = raw.index(STATUS_KEY) + len(STATUS_KEY)
    return int(raw[at : raw.index(b",", at)])
