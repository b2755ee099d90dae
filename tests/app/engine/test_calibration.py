"""Calibration: the cost model is measured once per graph, provider and device, cached beside the export
(or under cache_dir where the export is read-only), read on restart, and measured before the first batch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.engine import calibration, costs
from app.engine.calibration import load_or_measure
from app.engine.engine import Engine
from app.settings import Settings
from app.telemetry.metrics import Metrics


def synthetic(size: int, length: int) -> float:
    return 0.004 + size * (0.0002 + 0.0011 * length + 0.000003 * length**2)


def fake_model(folder: Path, sha: str = "ab" * 32) -> Any:
    """What load_or_measure reads of a model: its folder, graph digest, provider and longest input."""
    graph = SimpleNamespace(sha256=sha)
    manifest = SimpleNamespace(graphs={"encoder": {"int8": graph}})
    return SimpleNamespace(
        folder=folder,
        variant="int8",
        providers=["CPUExecutionProvider"],
        manifest=manifest,
        tokenizer=SimpleNamespace(max_length=128),
    )


def counting_runner() -> tuple[costs.Runner, list[int]]:
    runs: list[int] = []

    def run(size: int, length: int) -> float:
        runs.append(size)
        return synthetic(size, length)

    return run, runs


def test_measured_once_then_read_from_beside_the_export(tmp_path: Path) -> None:
    model = fake_model(tmp_path / "model")
    (tmp_path / "model").mkdir()
    run, runs = counting_runner()
    kwargs: dict[str, Any] = {
        "max_size": 8,
        "max_tokens": 4096,
        "intra_op_threads": 0,
        "cache_dir": tmp_path / "cache",
    }
    first = load_or_measure(model, run, **kwargs)
    assert runs and first.source == "measured at start-up, cached beside the export"
    (cached,) = (tmp_path / "model" / calibration.FOLDER).glob("*.json")
    assert json.loads(cached.read_text())["key"]["graph_sha256"] == "ab" * 32
    measured = len(runs)
    again = load_or_measure(model, run, **kwargs)
    assert len(runs) == measured  # a restart does not measure
    assert again.source == "read from the cache beside the export"
    assert (again.a, again.b, again.c, again.d) == (first.a, first.b, first.c, first.d)
    other = load_or_measure(fake_model(tmp_path / "model", sha="cd" * 32), run, **kwargs)
    assert len(runs) > measured and other.source.startswith("measured")  # another graph: its own


def test_a_read_only_export_folder_caches_under_cache_dir(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / calibration.FOLDER).write_text(
        "not a folder"
    )  # nothing can be written beside it (even as root)
    run, runs = counting_runner()
    kwargs: dict[str, Any] = {
        "max_size": 8,
        "max_tokens": 4096,
        "intra_op_threads": 0,
        "cache_dir": tmp_path / "cache",
    }
    first = load_or_measure(fake_model(folder), run, **kwargs)
    assert first.source == "measured at start-up, cached under cache_dir"
    marked = tmp_path / "marked"
    marked.mkdir()
    marked.chmod(0o555)  # read-only by its mode: left alone even by root, who could write there
    try:
        assert "under cache_dir" in load_or_measure(fake_model(marked, sha="ef" * 32), run, **kwargs).source
        assert not (marked / calibration.FOLDER).exists()
    finally:
        marked.chmod(0o755)
    assert list((tmp_path / "cache" / calibration.FOLDER).glob("*.json"))
    measured = len(runs)
    assert load_or_measure(fake_model(folder), run, **kwargs).source == "read from the cache under cache_dir"
    assert len(runs) == measured


def test_the_engine_measures_before_its_first_batch_and_reads_the_cache_on_restart(
    tiny_model_dir: Path, tmp_path: Path, tiny_settings: Settings
) -> None:
    from app.model.runtime import load_model

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns(calibration.FOLDER))
    settings = tiny_settings.model_copy(update={"model": str(folder), "cache_dir": tmp_path / "cache"})
    sources = []
    for _ in range(2):
        engine = Engine(load_model(settings), settings, Metrics())
        engine.start()
        try:
            assert engine.calibrated.wait(60)
            model = engine.batcher.costs
            assert model.measured and model.c > 0  # seconds per token, fitted on this machine
            described = engine.scheduling()
            assert described["cost_model"]["unit"] == "ms" and described["queue_delay_budget_ms"] > 0
            sources.append(model.source)
        finally:
            engine.stop()
    assert sources == [
        "measured at start-up, cached beside the export",
        "read from the cache beside the export",
    ]


def test_measuring_off_plans_by_batch_overhead_tokens(tiny_model: Any, tiny_settings: Settings) -> None:
    settings = tiny_settings.model_copy(update={"measure_batch_cost": False, "batch_overhead_tokens": 40})
    engine = Engine(tiny_model, settings, Metrics())
    engine.start()
    try:
        assert engine.calibrated.wait(30)
        model = engine.batcher.costs
        assert not model.measured and (model.a, model.c) == (40.0, 1.0)
        assert engine.scheduling()["cost_model"]["unit"] == "tokens"
    finally:
        engine.stop()
