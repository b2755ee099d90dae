"""``python -m app.bulk --model SRC --input PATH --output DIR [options]``: embed a corpus into Parquet.

Exit status: 0 every row embedded; 3 finished, with bad rows skipped (``DIR/_errors.jsonl``); 2 the job
cannot run (an unreadable or malformed input, options the model refuses, a model that cannot load, an
output folder holding another job); 130 interrupted (run the same command again to continue).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from app.bulk import flags
from app.bulk.output import ERRORS, OutputDir, SparseMode
from app.bulk.sources import FORMATS, Fields, InputError, find_inputs

EXIT_OK = 0
EXIT_CANNOT_RUN = 2
EXIT_SKIPPED = 3
EXIT_INTERRUPTED = 130
# Texts in the engine at once: enough for the batch planner to find equal lengths for full batches.
DEFAULT_WINDOW = 4096
# Rows per shard: ~150 MB of 768-wide float32 vectors; what a crash can cost at most.
DEFAULT_SHARD_ROWS = 50_000

log = logging.getLogger("app.bulk")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m app.bulk",
        description="Embed a corpus into Parquet shards with the service's own engine, on this machine or "
        "on Ray Data. Every vector equals what POST /embed returns for the same text and options. Run the "
        "same command again after a crash to continue where it stopped.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    io = p.add_argument_group("input and output")
    io.add_argument(
        "--model",
        default=None,
        help="what ZHEMBED_MODEL accepts: a hub id, a checkpoint folder (exported on first use into "
        "--cache-dir) or an exported folder; default ZHEMBED_MODEL, else bert-base-chinese",
    )
    io.add_argument("--input", required=True, help="a file, a folder (its files, recursively) or a glob")
    io.add_argument("--output", required=True, type=Path, help="the folder of the shards (created)")
    io.add_argument(
        "--format",
        choices=["auto", *FORMATS, "openai-batch"],
        default="auto",
        help="default: by file name (.jsonl/.ndjson, .parquet, .csv, .tsv, .txt; .gz of the line formats); "
        "openai-batch: --input is an OpenAI Batch API input file and --output the batch output file "
        "(JSON Lines) written, each line answered by the HTTP route its url names (docs/bulk.md)",
    )
    io.add_argument("--text-field", default="text", help="the field (column) holding the text; default text")
    io.add_argument("--id-field", default=None, help="the field holding each row's id; default FILE:LINE")
    io.add_argument(
        "--encoding",
        choices=["float", "int8", "ubinary", "binary"],
        default="float",
        help="float: float32 vectors; int8: int8 values and a per-row scale; ubinary / binary: the signs "
        "packed 8 a byte (uint8 / int8); each as POST /embed's encoding of that name",
    )
    sparse = io.add_mutually_exclusive_group()
    sparse.add_argument(
        "--sparse",
        action="store_true",
        help="also a sparse column: each row's SPLADE weights as POST /embed_sparse answers them (a model "
        "exported with --sparse, or a SparseEncoder folder); the encoder runs twice a row",
    )
    sparse.add_argument(
        "--sparse-only", action="store_true", help="the sparse column instead of the dense one"
    )
    io.add_argument(
        "--sparse-top-k",
        type=int,
        default=None,
        metavar="K",
        help="with --sparse or --sparse-only: only each row's K largest weights (as top_k)",
    )
    io.add_argument(
        "--shard-rows",
        type=int,
        default=DEFAULT_SHARD_ROWS,
        help=f"input rows per shard; default {DEFAULT_SHARD_ROWS:,}",
    )
    io.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what another job left in --output (without it, that is refused)",
    )
    embed = p.add_argument_group("embedding options (those of POST /embed; left out: the model's defaults)")
    for flag, spec in flags.option_arguments():
        embed.add_argument(flag, **spec)
    engine = p.add_argument_group("engine (the service's settings; ZHEMBED_* variables work as for it)")
    for flag, spec in flags.setting_arguments():
        engine.add_argument(flag, **spec)
    engine.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        help=f"texts in the engine at once, batched by length; default {DEFAULT_WINDOW}",
    )
    shown = p.add_argument_group("progress")
    shown.add_argument(
        "--progress",
        choices=["auto", "bar", "log", "off"],
        default="auto",
        help="auto: a bar on a terminal, a log line every --log-every seconds otherwise",
    )
    shown.add_argument("--log-every", type=float, default=10.0, help="seconds between log lines; default 10")
    ray = p.add_argument_group("Ray Data (pip install 'zhembed[ray]')")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run on Ray Data: alone, a Ray started here; or a cluster's address (auto, "
        "ray://head:10001) or, under `ray job submit`, auto",
    )
    ray.add_argument("--ray-actors", type=int, default=1, help="embedding actors (map_batches concurrency)")
    ray.add_argument("--ray-cpus", type=float, default=1.0, help="CPUs each actor reserves; default 1")
    ray.add_argument("--ray-gpus", type=float, default=0.0, help="GPUs each actor reserves; default 0")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="zhembed bulk: %(message)s", stream=sys.stderr)
    for name, value in (
        ("--window", args.window),
        ("--shard-rows", args.shard_rows),
        ("--ray-actors", args.ray_actors),
    ):
        if value < 1:
            return _cannot_run(f"{name} must be at least 1, not {value}")
    from app.bulk.batch_job import Refused as BatchRefused
    from app.bulk.openai_batch import JobFault
    from app.bulk.runner import Refused
    from app.errors import ServiceError
    from app.model.manifest import ManifestError
    from app.settings import SettingsError

    try:
        return _run(args)
    except (InputError, Refused, BatchRefused, flags.UsageError, ManifestError, SettingsError) as exc:
        return _cannot_run(str(exc))
    except JobFault as exc:
        return _cannot_run(f"the service failed a line, so the job stops (run it again to continue): {exc}")
    except ServiceError as exc:  # the options checked against the model, before any row
        return _cannot_run(f"the options do not fit this model: {exc.message}")
    except KeyboardInterrupt:
        print("zhembed bulk: interrupted; run the same command again to continue", file=sys.stderr)
        return EXIT_INTERRUPTED


def _cannot_run(message: str) -> int:
    print(f"zhembed bulk: {message}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def _run(args: argparse.Namespace) -> int:
    from app.bulk.runner import BulkSpec

    if args.format == "openai-batch":
        from app.bulk.batch_cli import run_batch

        return run_batch(args)
    fields = Fields(args.text_field, args.id_field)
    forced = None if args.format == "auto" else args.format
    files = find_inputs(args.input, forced, fields, exclude=args.output)
    settings = flags.settings_of(args, args.model)
    given = flags.given_options(args)
    mode: SparseMode = "only" if args.sparse_only else "beside" if args.sparse else "off"
    if args.sparse_top_k is not None and mode == "off":
        raise flags.UsageError("--sparse-top-k needs --sparse or --sparse-only")
    job = BulkSpec(
        files,
        fields,
        args.output,
        args.shard_rows,
        args.encoding,
        args.input,
        forced,
        mode,
        args.sparse_top_k,
    )
    if args.ray is not None:
        from app.bulk.ray_job import run_ray

        manifest = run_ray(job, settings, given, args)
    else:
        manifest = asyncio.run(_local(job, settings, given, args))
    return _summary(manifest, args.output)


async def _local(job: Any, settings: Any, given: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from app.bulk.embedder import Embedder
    from app.bulk.progress import Progress
    from app.bulk.runner import manifest_of, prepare, run_local

    embedder = Embedder(settings, given, job.fields.text, args.window, sparse=job.sparse, top_k=job.top_k)
    try:
        await embedder.check()
        state, manifest = prepare(
            OutputDir(job.output), manifest_of(job, embedder, settings.model), args.overwrite
        )
        if state == "done":
            log.info("%s is complete already (started %s)", job.output, manifest.get("started"))
            return manifest
        if state == "resume":
            log.info("continuing the job in %s (run %d)", job.output, manifest["runs"])
        progress = Progress(args.progress, args.log_every)
        try:
            manifest = await run_local(job, embedder, manifest, progress)
        finally:
            manifest["seconds"] = progress.close()
        return manifest
    finally:
        embedder.close()


def _summary(manifest: dict[str, Any], output: Path) -> int:
    counts = manifest.get("counts") or {}
    skipped = int(counts.get("skipped", 0))
    seconds = manifest.get("seconds")
    rate = f", {counts.get('embedded', 0) / seconds:.1f} texts/s" if seconds else ""
    where = f" (see {output / ERRORS})" if skipped else ""
    print(
        f"zhembed bulk: done: {counts.get('rows', 0):,} rows, {counts.get('embedded', 0):,} embedded, "
        f"{skipped:,} skipped{where}, {counts.get('tokens', 0):,} tokens in {counts.get('shards', 0)} "
        f"shards{rate} -> {output}",
        file=sys.stderr,
    )
    return EXIT_SKIPPED if skipped else EXIT_OK
