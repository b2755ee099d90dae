"""The tiny model of the ``--quick`` runs: a small BERT with the real bert-base-chinese vocab, exported by
the real export stage (the tests' ``make_tiny_source``). With ``LOADTEST_TINY_CACHE`` set to a folder,
each tiny export (a model's layers and variants, or :mod:`loadtest.models`' heads) is made once there (the
recipes are seeded) and read or copied where a run asks.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.model.manifest import Variant

CACHE_VARIABLE = "LOADTEST_TINY_CACHE"


@contextmanager
def exported(
    name: str, ready: Sequence[str], export: Callable[[Path], None], folder: Path | None = None
) -> Iterator[Path]:
    """``folder`` (else the cache's ``name``, else a temp dir that lives as long as the context), with
    ``export(folder)`` run first unless each file of ``ready`` is there: one exporter per folder, across
    processes (parallel test workers share the cache)."""
    cache = os.environ.get(CACHE_VARIABLE)
    with tempfile.TemporaryDirectory(prefix="zhembed-tiny-") as tmp:
        if folder is None:
            folder = (Path(cache) if cache else Path(tmp)) / name
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder.with_name(folder.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not all((folder / file).is_file() for file in ready):
                export(folder)  # run_export installs a manifest only with the export it describes
        yield folder


def _export(source: Path, out: Path, variants: Sequence[Variant], layers: int) -> None:
    from export.pipeline import ExportOptions, run_export
    from tests.conftest import TINY_CONFIG, make_tiny_source

    make_tiny_source(source, config={**TINY_CONFIG, "num_hidden_layers": layers})
    run_export(ExportOptions(out=out, model=str(source), variants=tuple(variants)), log=lambda _l: None)


def export_tiny(
    source: Path, out: Path, variants: Sequence[Variant] = ("fp32", "int8"), layers: int = 3
) -> Path:
    """Write a tiny BERT (``layers`` layers, hidden 64, real vocab) as a Hugging Face folder at ``source``
    and export it to ``out``; returns ``out``. Its manifest names the Hugging Face folder it came from.

    Under ``LOADTEST_TINY_CACHE`` the export is copied from that cache (made there first if it is not);
    the source is then the cache's (read it, do not write it) and ``source`` stays unwritten.
    """
    if not os.environ.get(CACHE_VARIABLE) or out.exists():  # an existing folder is re-exported in place
        _export(source, out, variants, layers)
        return out
    with exported(
        f"layers{layers}-{'-'.join(variants)}",
        ["model/manifest.json"],
        lambda entry: _export(entry / "source", entry / "model", variants, layers),
    ) as entry:
        shutil.copytree(entry / "model", out)
    return out


@contextmanager
def tiny_model(
    folder: Path | None = None, variants: Sequence[Variant] = ("fp32",), layers: int = 4
) -> Iterator[Path]:
    """The tiny model: an export already in ``folder``, else exported there (or into a temp dir that lives
    as long as the context)."""
    if folder is not None and (folder / "manifest.json").is_file():
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="zhembed-tiny-") as tmp:
        yield export_tiny(Path(tmp) / "source", folder or Path(tmp) / "model", variants, layers)
