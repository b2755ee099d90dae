"""``python -m app.bulk --format openai-batch --input requests.jsonl --output results.jsonl``: the command
line of the OpenAI batch format (:mod:`app.bulk.batch_job`), on this machine or on Ray Data."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from app.bulk import flags
from app.bulk.batch_job import begin, run_local
from app.bulk.embedder import Embedder
from app.bulk.output import model_entry
from app.bulk.progress import Progress
from app.settings import Settings

EXIT_OK = 0
EXIT_FAILED_LINES = 3


def run_batch(args: argparse.Namespace) -> int:
    """Answer ``--input`` into ``--output``; the exit status (0: every line answered 2xx; 3: some not).

    Raises:
        UsageError: flags that have no meaning here (each line's body carries its options).
        Refused: the output holds another job's answers.
        JobFault: a line answered 429 or 5xx.
    """
    unused = sorted(flags.given_options(args))
    if args.sparse or args.sparse_only or args.sparse_top_k is not None or args.encoding != "float":
        unused.append("encoding / sparse")
    if unused:
        raise flags.UsageError(
            f"--format openai-batch takes its options from each line's body, not flags ({', '.join(unused)})"
        )
    input_path = Path(args.input)
    if not input_path.is_file():
        raise flags.UsageError(f"--format openai-batch reads one file; {input_path} is not one")
    settings = flags.settings_of(args, args.model)
    # Room in the engine for the largest line the route accepts, however small --window is.
    window = max(args.window, settings.max_inputs_per_request)
    if args.ray is not None:
        from app.bulk.batch_ray import run_ray

        manifest = run_ray(input_path, args.output, settings, window, args)
    else:
        manifest = asyncio.run(_local(input_path, args.output, settings, window, args))
    counts = manifest.get("counts") or {}
    print(
        f"zhembed bulk: done: {counts.get('lines', 0):,} lines, {counts.get('answered', 0):,} answered 2xx, "
        f"{counts.get('failed', 0):,} with an error -> {args.output}",
        file=sys.stderr,
    )
    return EXIT_FAILED_LINES if counts.get("failed") else EXIT_OK


async def _local(
    input_path: Path, output: Path, settings: Settings, window: int, args: argparse.Namespace
) -> dict[str, Any]:
    embedder = Embedder(settings, {}, "input", window)
    try:
        source = args.model or settings.model
        model = model_entry(settings, embedder.model.manifest, embedder.model.variant, source)
        state, manifest = begin(input_path, output, model, args.overwrite)
        if state == "done":
            return manifest
        progress = Progress(args.progress, args.log_every)
        try:
            return await run_local(input_path, output, embedder, manifest, progress)
        finally:
            progress.close()
    finally:
        embedder.close()
