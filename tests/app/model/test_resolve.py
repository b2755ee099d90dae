"""Model resolution: an exported folder is used as is; anything else goes to the exporter subprocess."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.model.manifest import (
    SCHEMA_VERSION,
    ManifestError,
    OutdatedManifestError,
    load_manifest,
    sha256_file,
)
from app.model.resolve import cache_folder, resolve_model
from loadtest.server import free_port
from tests.hub_mirror import COMMIT, HubMirror, ModelScopeMirror


def test_a_folder_with_a_manifest_is_used_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir), None, tmp_path) == tiny_model_dir


def test_an_earlier_export_in_the_cache_is_reused(tiny_model_dir: Path, tmp_path: Path) -> None:
    target = cache_folder("some/hub-model", "main", tmp_path)
    target.mkdir(parents=True)
    (target / "manifest.json").write_text((tiny_model_dir / "manifest.json").read_text())
    assert resolve_model("some/hub-model", "main", tmp_path) == target


def test_an_older_export_in_the_cache_is_exported_again(
    tiny_source_dir: Path, tmp_path: Path, old_export: Callable[[Path], Path]
) -> None:
    """The cache is ours: an export made by an older build is redone (the exporter runs with --force)."""
    target = cache_folder(str(tiny_source_dir.resolve()), None, tmp_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    old_export(target)
    assert resolve_model(str(tiny_source_dir), None, tmp_path) == target
    manifest = load_manifest(target)
    assert manifest.schema_version == SCHEMA_VERSION and manifest.pooled_outputs["mean"][1] == "mean_1"
    assert sha256_file(target / "encoder.fp32.onnx") == manifest.graphs["encoder"]["fp32"].sha256


def test_an_exported_folder_of_an_older_schema_is_refused_with_the_command(
    tiny_source_dir: Path, tmp_path: Path, old_export: Callable[[Path], Path]
) -> None:
    """The user's own folder is not ours to rewrite: refused, untouched, with the command to run."""
    folder = old_export(tmp_path / "model")
    before = (folder / "manifest.json").read_text()
    with pytest.raises(OutdatedManifestError) as refused:
        resolve_model(str(folder), None, tmp_path / "cache")
    assert f"python -m export --model {tiny_source_dir} --out {folder} " in str(refused.value)
    assert str(refused.value).endswith("--force")
    assert (folder / "manifest.json").read_text() == before
    assert not (tmp_path / "cache").exists()


def test_a_broken_manifest_is_left_for_the_loader_to_report(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    assert resolve_model(str(tmp_path), None, tmp_path / "cache") == tmp_path


def test_cache_folders_differ_by_revision(tmp_path: Path) -> None:
    a = cache_folder("bert-base-chinese", None, tmp_path)
    b = cache_folder("bert-base-chinese", "abc123", tmp_path)
    assert a != b and a.parent == tmp_path and "bert-base-chinese" in a.name


def test_an_unreachable_hub_says_what_to_do_in_the_services_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the exporter subprocess fails at once, as with no network
    with pytest.raises(ManifestError) as failed:
        resolve_model("bert-base-chinese", None, tmp_path)
    message = str(failed.value)
    assert "cannot reach the Hugging Face hub to fetch bert-base-chinese" in message
    # one step with a local checkpoint, and the twin for trying the service without the weights
    assert "ZHEMBED_MODEL=/path/to/bert-base-chinese make serve" in message and "make serve-twin" in message
    assert "python -m export" not in message  # the exporter's own advice is for its own users


def test_a_hub_id_is_fetched_from_the_mirror_hf_endpoint_names(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_ENDPOINT reaches the exporter subprocess untouched: the hub id resolves through the mirror it
    names (a loopback server posing as one, serving the tiny checkpoint in the hub's URL layout)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache: every file from the mirror
    with HubMirror("tiny-org/tiny-bert", tiny_source_dir) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        folder = resolve_model("tiny-org/tiny-bert", None, tmp_path / "cache")
    assert folder == cache_folder("tiny-org/tiny-bert", None, tmp_path / "cache")
    source = load_manifest(folder).source
    assert (source.model, source.revision, source.local) == ("tiny-org/tiny-bert", None, False)
    assert source.weights_sha256 == sha256_file(tiny_source_dir / "model.safetensors")
    assert f"GET /tiny-org/tiny-bert/resolve/{COMMIT}/model.safetensors" in mirror.requests


def test_a_modelscope_id_is_downloaded_by_modelscopes_snapshot_download_and_exported(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """modelscope's real snapshot_download against a loopback server posing as ModelScope
    (MODELSCOPE_ENDPOINT): the files a BERT export reads are downloaded, exported, named in the manifest."""
    pytest.importorskip("modelscope", reason="the modelscope extra (installed by the dev extra)")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    with ModelScopeMirror("tiny-org/tiny-bert", tiny_source_dir) as modelscope:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", modelscope.endpoint)
        folder = resolve_model("modelscope:tiny-org/tiny-bert", None, tmp_path / "cache")
    assert folder == cache_folder("modelscope:tiny-org/tiny-bert", None, tmp_path / "cache")
    source = load_manifest(folder).source
    assert (source.model, source.revision, source.local) == ("modelscope:tiny-org/tiny-bert", "master", False)
    assert source.weights_sha256 == sha256_file(tiny_source_dir / "model.safetensors")
    fetched = {r.partition("FilePath=")[2] for r in modelscope.requests if "FilePath=" in r}
    assert fetched == {"config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors"}


def _modelscope_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """modelscope's cache in ``tmp_path``, its endpoint a loopback port nothing listens on; the cache."""
    pytest.importorskip("modelscope", reason="the modelscope extra (installed by the dev extra)")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS", "1")  # refused at once, not retried
    return tmp_path / "modelscope"


def test_an_unreachable_modelscope_falls_back_to_modelscopes_cache(
    tiny_source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelScope unreachable, the checkpoint in modelscope's own cache layout (what an earlier download
    left): the real snapshot_download finds it there, and it is exported."""
    cache = _modelscope_offline(tmp_path, monkeypatch)
    shutil.copytree(tiny_source_dir, cache / "models" / "tiny-org--tiny-bert" / "snapshots" / "master")
    source = load_manifest(resolve_model("modelscope:tiny-org/tiny-bert", None, tmp_path / "cache")).source
    assert (source.model, source.revision) == ("modelscope:tiny-org/tiny-bert", "master")
    assert source.weights_sha256 == sha256_file(tiny_source_dir / "model.safetensors")


def test_an_unreachable_modelscope_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _modelscope_offline(tmp_path, monkeypatch)
    with pytest.raises(ManifestError) as failed:
        resolve_model("modelscope:tiny-org/absent", None, tmp_path / "cache")
    message = str(failed.value)
    assert "cannot reach ModelScope to fetch tiny-org/absent" in message and "MODELSCOPE_CACHE" in message
    assert "Hugging Face hub" not in message
