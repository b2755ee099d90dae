"""``--format openai-batch --ray``: the lines answered on Ray Data, written by the driver.

The driver reads the file (:func:`~app.bulk.openai_batch.read_lines`: the checks that need every line,
as repeated custom_ids, are made there once), skips the lines already written (the same resumable
output as the single-machine job, :mod:`app.bulk.batch_job`), and hands the lines a route answers to
``map_batches`` with :class:`AnswerLines`, Ray Data's batch-inference pattern as in
:mod:`app.bulk.ray_job`: ``__init__`` builds the :class:`~app.bulk.embedder.Embedder` once per actor,
``__call__`` answers a batch of lines with the same :class:`~app.bulk.openai_batch.Answerer`. The
results come back in input order (``preserve_order``) and the driver appends them, with the lines no
route sees, in chunks; a crash of the driver resumes as the single-machine job does, and a killed actor's
batch is run again by Ray. The lines to answer are held on the driver (``from_items``): an OpenAI batch
file is at most 50,000 requests and 200 MB.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.bulk.batch_job import ChunkWriter, answer_in_order, begin, finish, resume, todo
from app.bulk.embedder import Embedder
from app.bulk.openai_batch import Answerer, Line, batch_routes, read_lines, refused
from app.bulk.output import model_entry
from app.model.runtime import check_model
from app.settings import Settings

# Lines per map_batches batch: enough for the engine to batch by length within it.
BATCH_LINES = 512


class AnswerLines:
    """One Ray actor's model: built once in ``__init__``, a batch of lines answered per ``__call__``."""

    def __init__(self, settings: Settings, window: int) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.embedder = Embedder(settings, {}, "input", window)
        self.answerer = Answerer(self.embedder.service)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lines = [
            Line(int(n), str(c), str(u), bytes(b), inputs=int(i))
            for n, c, u, b, i in zip(
                batch["number"], batch["custom_id"], batch["url"], batch["body"], batch["inputs"], strict=True
            )
        ]
        answers = self.loop.run_until_complete(self._answer(lines))
        return {
            "number": batch["number"],
            "out": np.array([a for a, _ in answers], dtype=object),
            "ok": np.array([ok for _, ok in answers], dtype=bool),
        }

    async def _answer(self, lines: list[Line]) -> list[tuple[bytes, bool]]:
        return [a async for a in answer_in_order(self.answerer, iter(lines), self.embedder.window)]


def run_ray(
    input_path: Path, output: Path, settings: Settings, window: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Answer ``input_path`` into ``output`` on Ray Data (``args.ray``: "local" for a Ray started here,
    else the cluster's address). Returns the manifest written.

    Raises:
        Refused: the output holds another job's answers.
        JobFault: a line answered 429 or 5xx (in an actor; the lines written before it stay).
    """
    import ray

    folder, model_manifest, choice = check_model(settings)
    model = model_entry(settings, model_manifest, choice.variant, args.model or settings.model)
    settings = settings.model_copy(update={"model": str(folder)})
    state, manifest = begin(input_path, output, model, args.overwrite)
    if state == "done":
        return manifest
    done, last_id = resume(output, manifest)
    lines = list(todo(read_lines(input_path, batch_routes()), done, last_id, output))
    routed = [line for line in lines if line.error is None]
    started = not ray.is_initialized()
    if started:
        ray.init(
            address=None if args.ray == "local" else args.ray, include_dashboard=False, log_to_driver=False
        )
    writer = ChunkWriter(output)
    try:
        answers = _answers(ray, routed, settings, window, args)
        for line in lines:
            if line.error is not None:
                writer.add(refused(line))
                continue
            number, out = next(answers)
            if number != line.number:
                raise RuntimeError(f"Ray answered line {number} where line {line.number} was due")
            writer.add(out)
    finally:
        writer.close()
        if started:
            ray.shutdown()
    return finish(output, manifest)


def _answers(
    ray: Any, routed: list[Line], settings: Settings, window: int, args: argparse.Namespace
) -> Iterator[tuple[int, bytes]]:
    """(line number, output line) of each of ``routed``, in order, from the actors."""
    if not routed:
        return
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    items = [
        {"number": x.number, "custom_id": x.custom_id, "url": x.url, "body": x.body, "inputs": x.inputs}
        for x in routed
    ]
    ds = ray.data.from_items(items).map_batches(
        AnswerLines,
        fn_constructor_kwargs={"settings": settings, "window": window},
        batch_size=BATCH_LINES,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=args.ray_actors),
        num_cpus=args.ray_cpus,
        num_gpus=args.ray_gpus or None,
    )
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        yield from zip((int(n) for n in batch["number"]), (bytes(o) for o in batch["out"]), strict=True)
