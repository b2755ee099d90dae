"""The tiny model of the ``--quick`` runs: a small BERT with the real bert-base-chinese vocab, exported by
the real export stage (the tests' ``make_tiny_source``, so the tests and the harness share one recipe)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.model.manifest import Variant


def export_tiny(
    source: Path, out: Path, variants: Sequence[Variant] = ("fp32", "int8"), layers: int = 3
) -> tuple[Path, Path]:
    """Write a tiny BERT (``layers`` layers, hidden 64, real vocab) as a Hugging Face folder at ``source``
    and export it to ``out``. Returns (model dir, HF source)."""
    from export.pipeline import ExportOptions, run_export
    from tests.conftest import TINY_CONFIG, make_tiny_source

    make_tiny_source(source, config={**TINY_CONFIG, "num_hidden_layers": layers})
    run_export(ExportOptions(out=out, model=str(source), variants=tuple(variants)), log=lambda _l: None)
    return out, source


@contextmanager
def quick_model(
    variants: Sequence[Variant] = ("fp32", "int8"), layers: int = 3
) -> Iterator[tuple[Path, Path]]:
    """:func:`export_tiny` into a temp dir that lives as long as the context: (model dir, HF source)."""
    with tempfile.TemporaryDirectory(prefix="zhembed-quick-") as tmp:
        yield export_tiny(Path(tmp) / "source", Path(tmp) / "model", variants, layers)
