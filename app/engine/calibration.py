"""Measuring the batch cost model on this machine once, cached as JSON beside the export (or under
``cache_dir``) and keyed by the graph, provider, runtime, threads and device. Workers that start together
measure once: the first takes a file lock, the others wait for its result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.engine.costs import SCHEMA, CostModel, Runner, fit, grid, measure
from app.model.runtime import CUDA, OnnxModel, cpu_flags

log = logging.getLogger(__name__)

FOLDER = "batch_costs"  # beside the export's manifest.json, or under cache_dir


def session_runner(model: OnnxModel) -> Runner:
    """Times one encoder run of a synthetic batch, fetching what a default /embed fetches."""
    fetch = [model.pooled_output(model.num_layers, "mean") or model.output_name(model.num_layers)]
    cls_id, sep_id = model.manifest.tokenizer.cls_id, model.manifest.tokenizer.sep_id
    # Ids of ordinary characters; what they say does not change what a run costs.
    first = 672 if model.manifest.config.vocab_size > 8000 else cls_id + 3
    last = max(first + 1, min(8000, model.manifest.config.vocab_size))
    rng = np.random.default_rng(0)

    def run(size: int, length: int) -> float:
        ids = rng.integers(first, last, (size, length), dtype=np.int64)
        ids[:, 0], ids[:, -1] = cls_id, sep_id
        mask = np.ones_like(ids)
        started = time.perf_counter()
        model.encode(ids, mask, fetch)
        return time.perf_counter() - started

    return run


def device_key(model: OnnxModel, intra_op_threads: int) -> dict[str, str]:
    """What the cost depends on besides the batch: the graph, the provider, the runtime and the device."""
    provider = model.providers[0]
    key = {
        "graph_sha256": model.manifest.graphs["encoder"][model.variant].sha256,
        "provider": provider,
        "onnxruntime": ort.__version__,
    }
    if provider == CUDA:
        key["device"] = gpu_name()
    else:
        key["device"] = _field(Path("/proc/cpuinfo"), "model name") or "unknown CPU"
        key["cpu_flags_sha256"] = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
        key["threads"] = f"{intra_op_threads or 'all'} of {len(os.sched_getaffinity(0))} cores"
    return key


def _field(path: Path, prefix: str) -> str | None:
    """The value of the first ``prefix: value`` line of ``path``."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    return None


def gpu_name() -> str:
    """The first GPU's name, from the NVIDIA driver's /proc entries or nvidia-smi."""
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        if (name := _field(info, "Model:")) is not None:
            return name
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
        if name := out.partition("\n")[0].strip():
            return name
    return "unknown GPU"


def _writable(folder: Path) -> bool:
    """Whether ``folder`` may be written to (created if need be). One that nobody may write to counts as
    read-only even for root, who could: an export marked read-only is left as it is."""
    existing = folder if folder.exists() else folder.parent
    try:
        if existing.exists() and not existing.stat().st_mode & 0o222:
            return False
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            return True
    except OSError:
        return False


def _read(path: Path, key: dict[str, str], where: str) -> CostModel | None:
    # None where there is none, or a file of another shape: measured again and rewritten.
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, IndexError):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") == key:
            return CostModel.from_json(data, f"read from the cache {where}")
    return None


def load_or_measure(
    model: OnnxModel,
    run: Runner,
    *,
    max_size: int,
    max_tokens: int,
    intra_op_threads: int,
    cache_dir: Path,
    max_attention: int = 0,
) -> CostModel:
    """The cost model for this graph, provider and device: from the cache, or measured and cached."""
    key = device_key(model, intra_op_threads)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24] + ".json"
    # Where each folder is, as /info says it: never a path (the model is named, not located, there).
    folders = {"beside the export": model.folder / FOLDER, "under cache_dir": cache_dir / FOLDER}
    for where, folder in folders.items():
        if (cached := _read(folder / name, key, where)) is not None:
            return cached
    shapes = grid(max_size, max_tokens, model.tokenizer.max_length, max_attention)
    writable = next(((w, f) for w, f in folders.items() if _writable(f)), None)
    if writable is None:
        log.warning(
            "cannot write the batch cost model to %s: measured on every start",
            " or ".join(map(str, folders.values())),
        )
        return _measured(run, key, shapes, "measured at start-up (not cached: no writable folder)")
    where, folder = writable
    path = folder / name
    # A second worker waits here for the first one's result; closing the file lets the lock go.
    with (folder / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (cached := _read(path, key, where)) is not None:  # another worker measured it meanwhile
            return cached
        fitted = _measured(run, key, shapes, f"measured at start-up, cached {where}")
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(fitted.to_json(), indent=1))
        partial.replace(path)  # readers see the whole file or none
        log.info("batch cost model cached in %s", path)
        return fitted


def _measured(run: Runner, key: dict[str, str], shapes: list[tuple[int, int]], source: str) -> CostModel:
    started = time.perf_counter()
    points = measure(run, shapes)
    took = time.perf_counter() - started
    model = CostModel(*fit(points), "s", source, tuple(points), key, took)
    errors = np.abs(model.errors())
    log.info(
        "batch cost on %s: %.3f ms + B x (%.4f + %.5f S + %.2e S^2) ms; %d points in %.1f s, "
        "fit error max %.1f%% mean %.1f%%",
        key.get("device"),
        *(x * 1e3 for x in (model.a, model.b, model.c, model.d)),
        len(points),
        took,
        errors.max() * 100,
        errors.mean() * 100,
    )
    return model
