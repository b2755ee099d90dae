"""The core's model digest (part of every cache key), as the service computes it from the model it serves:
every graph and tokenizer setting that changes an answer changes it; and the sequences it queues carry the
time of the engine's clock; and the one cache flow (Core.cached) every caching task goes through."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cache.memory_tier import MemoryLRU
from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.scheduler import Scheduler
from app.engine.work import Job, Need, Seq
from app.model.manifest import MANIFEST_NAME
from app.model.runtime import load_model
from app.settings import Settings
from app.tasks.core import Core, Packing, taken
from app.telemetry.metrics import Metrics
from tests.app.engine.fake_clock import FakeClock


def served_digest(folder: Path) -> str:
    """The digest a service of the fp32 graphs of ``folder`` puts in its cache keys."""
    settings = Settings(model=str(folder), variant="fp32", intra_op_threads=1, cache_bytes=0, warmup=False)
    metrics = Metrics()
    model = load_model(settings)
    return Core(
        settings, model, Engine(model, settings, metrics), VectorCache(None, None, metrics)
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
    core = Core(tiny_settings, tiny_model, engine, VectorCache(None, None, metrics))
    ids = np.array([101, 872, 102], np.int64)
    asyncio.run(core.run([ids, ids], Need(layers=(1,), pooling="cls")))
    assert [seq.enqueued_at for seq in queued] == [0.0, 0.0]  # the simulated clock's time, as given


class Doubling:
    """A task that computes each key's length twice over, recording what it was asked and the input each
    distinct key was first seen at; its entries are its rows, and the key space is counted."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.asked: list[list[str]] = []
        self.first: list[list[int]] = []
        self.spaces = 0
        self.packing = Packing(self._space, 1, np.asarray, np.stack, taken)

    def _space(self) -> str:
        self.spaces += 1
        return self.core.key_space(output="test")

    async def compute(self, todo: list[str], first: Any) -> np.ndarray:
        self.asked.append(todo)
        self.first.append([first(k) for k in range(len(todo))])
        assert self.core.engine.admission.in_use == 5  # every input's permit held while computing
        return np.array([[2.0 * len(k)] for k in todo], np.float32)

    def answer(self, keys: list[str]) -> list[float]:
        return asyncio.run(self.core.cached(keys, self.compute, self.packing))[:, 0].tolist()


def core_of(model: Any, settings: Settings, memory: MemoryLRU | None) -> Core:
    metrics = Metrics()
    return Core(settings, model, Engine(model, settings, metrics), VectorCache(memory, None, metrics))


def test_without_a_cache_each_distinct_key_is_computed_once_named_by_its_first_input(
    tiny_model: Any, tiny_settings: Settings
) -> None:
    task = Doubling(core_of(tiny_model, tiny_settings, None))
    assert task.answer(["bb", "a", "bb", "ccc", "a"]) == [4.0, 2.0, 4.0, 6.0, 2.0]
    assert task.asked == [["bb", "a", "ccc"]] and task.first == [[0, 1, 3]]
    assert task.spaces == 0  # no cache: no key space hashed
    assert task.core.engine.admission.in_use == 0


def test_with_a_cache_what_it_holds_is_not_computed_again(tiny_model: Any, tiny_settings: Settings) -> None:
    task = Doubling(core_of(tiny_model, tiny_settings, MemoryLRU(1 << 20)))
    assert task.answer(["bb", "a", "bb", "dddd", "a"]) == [4.0, 2.0, 4.0, 8.0, 2.0]
    assert task.answer(["a", "bb", "ccc", "ccc", "dddd"]) == [2.0, 4.0, 6.0, 6.0, 8.0]
    assert task.asked == [["bb", "a", "dddd"], ["ccc"]]
    assert task.first == [[0, 1, 3], [2]]
    assert task.spaces == 2 and task.core.engine.admission.in_use == 0
