"""Loading: variant and provider choice, sha256 checks, one clear message on a bad model folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.model import pool
from app.model.manifest import ManifestError, load_manifest
from app.model.runtime import CPU, CUDA, MLM_ROWS, OnnxModel, choose, load_model, session_options
from app.settings import Settings


def test_auto_picks_int8_on_cpu_and_fp16_on_cuda(tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    cpu = choose(manifest, "auto", None, [CPU])
    assert cpu.variant == "int8" and cpu.providers == [CPU] and "int8" in cpu.reason
    cuda = choose(manifest, "auto", None, [CUDA, CPU])
    assert cuda.variant == "fp16" and cuda.providers == [CUDA, CPU]
    assert choose(manifest, "fp32", None, [CPU]).variant == "fp32"
    with pytest.raises(ManifestError, match="not available"):
        choose(manifest, "auto", [CUDA], [CPU])


def test_loads_the_configured_variant(tiny_model: object) -> None:
    assert getattr(tiny_model, "variant") == "fp32"  # noqa: B009
    assert getattr(tiny_model, "has_mlm_head") and getattr(tiny_model, "has_pooler")  # noqa: B009


def test_the_masked_lm_head_runs_in_pieces_of_at_most_mlm_rows(
    tiny_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = 2 * MLM_ROWS + 5
    hidden = np.random.default_rng(0).standard_normal((rows, tiny_model.hidden_size)).astype(np.float32)
    pieces: list[int] = []
    run = tiny_model._mlm.run

    def counted(outputs: list[str], feed: dict[str, np.ndarray]) -> Any:
        pieces.extend(len(x) for x in feed.values())
        return run(outputs, feed)

    monkeypatch.setattr(tiny_model._mlm, "run", counted)
    whole = tiny_model.mask_logits(hidden)
    assert pieces == [MLM_ROWS, MLM_ROWS, 5] and whole.shape[0] == rows
    one_by_one = np.concatenate([tiny_model.mask_logits(hidden[i : i + 1]) for i in range(0, rows, 37)])
    np.testing.assert_allclose(whole[::37], one_by_one, rtol=1e-5, atol=1e-5)


def test_pooled_outputs_are_named_by_layer_and_mode(tiny_model: Any) -> None:
    assert tiny_model.pooled_output(1, "mean") == "mean_1"
    assert tiny_model.pooled_output(tiny_model.num_layers, "cls") == f"cls_{tiny_model.num_layers}"
    assert tiny_model.pooled_output(1, "pooler") is None  # the pooler is an output of its own
    assert tiny_model.pooled_output(tiny_model.num_layers + 1, "mean") is None


def test_a_graph_without_pooled_outputs_has_none_to_name(tiny_model_dir: Path) -> None:
    """A graph that lacks an output the manifest declares: None, so the engine pools in numpy."""
    manifest = load_manifest(tiny_model_dir)
    stripped = {"cls": manifest.pooled_outputs["cls"], "mean": {1: "no_such_output"}}
    model = OnnxModel(
        tiny_model_dir,
        manifest.model_copy(update={"pooled_outputs": stripped}),
        choose(manifest, "fp32", None, [CPU]),
        intra_op_threads=1,
    )
    assert model.pooled_output(1, "mean") is None and model.pooled_output(1, "cls") == "cls_1"


def test_corrupt_or_missing_files_refuse_to_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "encoder.int8.onnx").write_bytes(b"garbage")
    with pytest.raises(ManifestError, match=r"encoder\.int8\.onnx: sha256"):
        load_model(Settings(model=str(broken), variant="int8"))
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match=r"tokenizer\.json: missing"):
        load_model(Settings(model=str(broken), variant="fp32"))


def refusal(*args: str) -> str:
    """``python -m app ARGS`` refusing to start: its one line on stderr (exit status 2)."""
    done = subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def broken_model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "manifest.json").write_text("{not json")
    return tmp_path / "model"


def test_python_m_app_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    line = refusal("--model", str(broken_model(tmp_path)))
    assert "cannot start" in line and "not readable JSON" in line


def test_the_service_never_imports_torch(tiny_model_dir: Path) -> None:
    """Nor redis-py unless Redis is configured (it is imported when the cache is built with a URL)."""
    code = (
        "import sys; from app.serving.factory import create_app; from app.model.runtime import load_model; "
        "from app.settings import Settings; "
        f"load_model(Settings(model={str(tiny_model_dir)!r})); "
        "bad = [m for m in ('torch', 'transformers', 'optimum', 'redis') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


SHARED_POOL_PROBE = """
import os, sys
from app.model.runtime import load_model
from app.settings import Settings

def threads() -> int:
    return len(os.listdir("/proc/self/task"))

before = threads()
settings = Settings(model=sys.argv[1], variant="fp32", intra_op_threads=int(sys.argv[3]))
models = [load_model(settings, shared_pool=sys.argv[2] == "1") for _ in range(3)]  # kept: their pools live
print(threads() - before, *{model.threads for model in models})
"""


def started(folder: Path, shared: bool, intra_op_threads: int) -> tuple[int, int]:
    """The threads three models of ``folder`` started, loaded in a process of their own (ONNX Runtime makes
    the shared pool once per process), and the intra-op threads each says its runs get."""
    done = subprocess.run(
        [sys.executable, "-c", SHARED_POOL_PROBE, str(folder), str(int(shared)), str(intra_op_threads)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    count, threads = done.stdout.split()[-2:]
    return int(count), int(threads)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_several_models_share_one_thread_pool(tiny_model_dir: Path) -> None:
    """Three models of two sessions each (encoder, masked-LM head), 3 intra-op threads: a pool per session
    starts 2 threads each (12), the shared pool 2 in all."""
    assert started(tiny_model_dir, shared=False, intra_op_threads=3) == (12, 3)
    assert started(tiny_model_dir, shared=True, intra_op_threads=3) == (2, 3)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_the_shared_pool_leaves_a_core_unless_told_its_size(tiny_model_dir: Path) -> None:
    """With ``intra_op_threads`` 0 the shared pool has every physical core but one (at least one): it
    starts that many threads but the caller's, and each model says its runs get that many."""
    size = pool.threads(0)
    assert size == max(1, pool.physical_cores() - 1)
    assert started(tiny_model_dir, shared=True, intra_op_threads=0) == (size - 1, size)


def test_the_pool_size_is_the_setting_or_every_physical_core_but_one() -> None:
    assert [pool.threads(0, cores) for cores in (1, 2, 8)] == [1, 1, 7]
    assert pool.threads(3, cores=8) == 3 and pool.threads(12, cores=2) == 12


def test_physical_cores_count_hyperthreads_of_one_core_once(tmp_path: Path) -> None:
    """Read from each allowed CPU's topology: two CPUs of one core are one core; without the topology,
    the CPUs themselves count."""
    allowed = sorted(os.sched_getaffinity(0))

    def topology(core_of: Callable[[int], int]) -> Path:
        root = tmp_path / f"cpus-{len(list(tmp_path.iterdir()))}"
        for cpu in allowed:
            folder = root / f"cpu{cpu}" / "topology"
            folder.mkdir(parents=True)
            (folder / "physical_package_id").write_text("0\n")
            (folder / "core_id").write_text(f"{core_of(cpu)}\n")
        return root

    assert pool.physical_cores(topology(lambda cpu: cpu)) == len(allowed)
    assert pool.physical_cores(topology(lambda cpu: cpu // 2)) == len({cpu // 2 for cpu in allowed})
    assert pool.physical_cores(tmp_path / "none") == len(allowed)


@pytest.mark.parametrize("workers", ["1", "2"])  # load_models in one process; check_models before workers
def test_a_bad_model_of_several_stops_the_start_with_one_line_naming_it(
    tiny_model_dir: Path, tmp_path: Path, workers: str
) -> None:
    broken = broken_model(tmp_path)
    line = refusal("--model", f"embed={tiny_model_dir}", "--model", f"tagger={broken}", "--workers", workers)
    assert "cannot start: model tagger: " in line and "not readable JSON" in line


def test_the_sessions_of_a_model_of_several_stop_spinning_when_their_run_returns() -> None:
    # A pool's threads spinning after its run took the cores from the next session's (docs/performance.md:
    # the encoder ran 45% slower beside the sparse graph); alone, a session keeps ONNX Runtime's default.
    key = "session.force_spinning_stop"
    assert session_options(CPU, 0, sessions=2).get_session_config_entry(key) == "1"
    assert session_options(CPU, 0, sessions=3).get_session_config_entry(key) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        session_options(CPU, 0).get_session_config_entry(key)
