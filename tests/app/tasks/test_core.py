"""The core's model digest (part of every cache key), as the service computes it from the model it serves:
every graph and tokenizer setting that changes an answer changes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.model.manifest import MANIFEST_NAME
from app.model.runtime import load_model
from app.settings import Settings
from app.tasks.core import Core
from app.telemetry.metrics import Metrics


def served_digest(folder: Path) -> str:
    """The digest a service of the fp32 graphs of ``folder`` puts in its cache keys."""
    settings = Settings(model=str(folder), variant="fp32", intra_op_threads=1, cache_bytes=0, warmup=False)
    metrics = Metrics()
    model = load_model(settings)
    return Core(
        settings, model, Engine(model, settings, metrics), VectorCache(None, None, metrics), metrics
    ).model_digest


def test_the_tokenizers_max_length_changes_the_digest(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["tokenizer"]["max_length"] //= 2  # texts are cut shorter: other vectors
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert served_digest(copy) != served_digest(tiny_model_dir)
    assert served_digest(copy) == served_digest(copy)


@pytest.mark.slow
def test_another_sparse_graph_beside_the_same_encoder_changes_the_digest(
    tiny_source_dir: Path, tiny_sparse_dir: Path, tmp_path: Path
) -> None:
    from export.pipeline import ExportOptions, run_export

    out = tmp_path / "model"
    run_export(ExportOptions(out=out, model=str(tiny_source_dir), sparse="sum"), log=lambda _line: None)
    assert (
        json.loads((out / MANIFEST_NAME).read_text())["graphs"]["encoder"]["fp32"]["sha256"]
        == json.loads((tiny_sparse_dir / MANIFEST_NAME).read_text())["graphs"]["encoder"]["fp32"]["sha256"]
    )
    assert served_digest(out) != served_digest(tiny_sparse_dir)
