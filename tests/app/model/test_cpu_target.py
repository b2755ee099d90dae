"""An int8 graph exported for VNNI CPUs (256 activation levels) refuses to load where it would be wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.model import runtime
from app.model.manifest import ANY_CPU, VNNI, ManifestError, load_manifest
from app.settings import Settings

AVX2_FLAGS = "fpu vme sse sse2 avx avx2 fma bmi2"


def _cpuinfo(folder: Path, flags: str) -> Path:
    path = folder / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    return path


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2_FLAGS, False),
        (AVX2_FLAGS + " avx512f avx512bw", False),  # plain AVX-512 saturates u8 x s8 pairs too
        (AVX2_FLAGS + " avx512f avx512_vnni", True),
        (AVX2_FLAGS + " avx_vnni", True),
    ],
)
def test_vnni_is_read_from_the_cpu_flags(tmp_path: Path, flags: str, expected: bool) -> None:
    assert runtime.cpu_has_vnni(_cpuinfo(tmp_path, flags)) is expected


def test_no_cpuinfo_counts_as_no_vnni(tmp_path: Path) -> None:
    assert runtime.cpu_has_vnni(tmp_path / "absent") is False


@pytest.fixture
def vnni_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model with its int8 graphs marked as exported for VNNI (the manifest is not hashed)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    raw = json.loads((folder / "manifest.json").read_text())
    for graph in raw["graphs"].values():
        graph["int8"]["recipe"] |= {"cpu": VNNI, "act_levels": 256}
    (folder / "manifest.json").write_text(json.dumps(raw))
    return folder


def test_a_vnni_graph_refuses_to_load_without_vnni_in_one_line(
    vnni_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: False)
    with pytest.raises(ManifestError, match="exported for CPUs with VNNI") as caught:
        runtime.load_model(Settings(model=str(vnni_model), variant="int8"))
    assert "\n" not in str(caught.value) and "256 activation levels" in str(caught.value)
    # The fp32 graphs of the same folder run anywhere.
    assert runtime.load_model(Settings(model=str(vnni_model), variant="fp32")).variant == "fp32"


def test_a_vnni_graph_loads_on_a_vnni_cpu(vnni_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: True)
    assert runtime.load_model(Settings(model=str(vnni_model), variant="int8")).variant == "int8"


def test_graphs_without_a_cpu_record_run_anywhere(tiny_model_dir: Path) -> None:
    graph = load_manifest(tiny_model_dir).graphs["encoder"]["int8"]
    assert graph.model_copy(update={"recipe": {}}).cpu == ANY_CPU
    runtime.check_cpu(graph.model_copy(update={"recipe": {}}), has_vnni=False)
