"""The manifest: read, versioned, and the files it lists verified."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.model.manifest import (
    LAST_HIDDEN_STATE,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    ManifestError,
    OutdatedManifestError,
    Source,
    layer_output_name,
    load_manifest,
    pooled_output_name,
    verify_files,
)


def test_layer_output_names() -> None:
    assert layer_output_name(12, 12) == LAST_HIDDEN_STATE
    assert layer_output_name(6, 12) == "hidden_state_6"
    with pytest.raises(ValueError):
        layer_output_name(13, 12)


def test_pooled_output_names() -> None:
    assert pooled_output_name("cls", 12, 12) == "cls_12"
    assert pooled_output_name("mean", 1, 12) == "mean_1"
    with pytest.raises(ValueError, match="outside"):
        pooled_output_name("mean", 0, 12)
    with pytest.raises(ValueError, match="not computed in the graph"):
        pooled_output_name("pooler", 12, 12)  # type: ignore[arg-type]


def test_an_older_schema_is_refused_with_the_command_that_exports_it_again(
    tmp_path: Path, tiny_source_dir: Path, old_export: Callable[[Path], Path]
) -> None:
    assert SCHEMA_VERSION == 3
    folder = old_export(tmp_path / "my model")
    with pytest.raises(OutdatedManifestError) as caught:
        load_manifest(folder)
    command = (
        f"python -m export --model {tiny_source_dir} --out '{folder}' --variants fp32,fp16,int8 --opset 17 "
        "--force"
    )
    assert caught.value.command == command and caught.value.found == 1
    assert str(caught.value).endswith(
        f"has schema_version 1, older than the 3 this build reads: export it again with: {command}"
    )


def test_missing_unreadable_and_other_versions_are_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ManifestError, match="export the model first"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="not readable JSON"):
        load_manifest(tmp_path)
    raw = json.loads((tiny_model_dir / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**raw, "schema_version": 99}))
    with pytest.raises(ManifestError, match="schema_version 99"):
        load_manifest(tmp_path)


def test_verify_lists_every_bad_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = load_manifest(tiny_model_dir)
    files = dict(manifest.tokenizer.files)
    verify_files(tiny_model_dir, files)
    folder = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, folder)
    names = sorted(files)
    (folder / names[0]).unlink()
    (folder / names[1]).write_text("tampered")
    with pytest.raises(ManifestError) as caught:
        verify_files(folder, files)
    assert f"{names[0]}: missing" in str(caught.value) and f"{names[1]}: sha256" in str(caught.value)


@pytest.mark.parametrize(
    ("model", "local", "name"),
    [
        ("bert-base-chinese", False, "bert-base-chinese"),
        ("google-bert/bert-base-chinese", False, "google-bert/bert-base-chinese"),
        ("/home/someone/models/bert-base-chinese-twin-source", True, "bert-base-chinese-twin-source"),
        ("relative/folder/", True, "folder"),
    ],
)
def test_a_source_is_named_by_its_hub_id_or_its_folder_never_its_path(
    model: str, local: bool, name: str
) -> None:
    source = Source(
        model=model, revision=None, local=local, weights="pretrained", weights_sha256=None, fingerprint="f"
    )
    assert source.name() == name


def test_a_manifest_without_the_matryoshka_fields_reads_as_not_trained_for_shorter_vectors(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # Written before the fields existed: same schema_version, read with their defaults, no re-export.
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    raw = json.loads((folder / "manifest.json").read_text())
    assert raw["defaults"].pop("matryoshka") is False and raw["defaults"].pop("matryoshka_dimensions") is None
    (folder / "manifest.json").write_text(json.dumps(raw))
    defaults = load_manifest(folder).defaults
    assert defaults.matryoshka is False and defaults.matryoshka_dimensions is None
