"""The core's model digest (part of every cache key), as the service computes it from the model it serves:
every graph and tokenizer setting that changes an answer changes it; and the sequences it queues carry the
time of the engine's clock."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.scheduler import Scheduler
from app.engine.work import Job, Need, Seq
from app.model.manifest import MANIFEST_NAME
from app.model.runtime import load_model
from app.settings import Settings
from app.tasks.core import Core
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock


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


def test_the_sequences_a_task_queues_carry_the_engines_clock(
    tiny_model: Any, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    engine = Engine(tiny_model, tiny_settings, metrics, scheduler=Scheduler(FakeClock(0.0)))
    queued: list[Seq] = []

    async def run(job: Job, sequences: list[Seq]) -> Job:  # what the engine was handed, unrun
        queued.extend(sequences)
        return job

    monkeypatch.setattr(engine, "run", run)
    core = Core(tiny_settings, tiny_model, engine, VectorCache(None, None, metrics), metrics)
    ids = np.array([101, 872, 102], np.int64)
    asyncio.run(core.run([ids, ids], Need(layers=(1,), pooling="cls")))
    assert [seq.enqueued_at for seq in queued] == [0.0, 0.0]  # the simulated clock's time, as given
