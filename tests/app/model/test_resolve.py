"""Model resolution: an exported folder is used as is; anything else goes to the exporter subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.model.manifest import ManifestError
from app.model.resolve import cache_folder, resolve_model


def test_a_folder_with_a_manifest_is_used_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir), None, tmp_path) == tiny_model_dir


def test_an_earlier_export_in_the_cache_is_reused(tiny_model_dir: Path, tmp_path: Path) -> None:
    target = cache_folder("some/hub-model", "main", tmp_path)
    target.mkdir(parents=True)
    (target / "manifest.json").write_text((tiny_model_dir / "manifest.json").read_text())
    assert resolve_model("some/hub-model", "main", tmp_path) == target


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
