"""Stage 1 of the export: where a ``modelscope:ORG/NAME`` checkpoint comes from.

modelscope's ``snapshot_download`` is replaced here by one that hands back the tiny checkpoint's folder (the
tests cannot reach ModelScope, and need not have the extra installed); tests/app/model/test_resolve.py runs
the real one against modelscope's own cache.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from export.source import ExportError, HubUnreachableError, resolve


class _HubError(Exception):
    pass


def _fake_modelscope(
    monkeypatch: pytest.MonkeyPatch, folder: Path, online: bool = True
) -> list[dict[str, Any]]:
    """modelscope and modelscope_hub.errors as the exporter imports them, ModelScope reachable or not
    (then only a ``local_files_only`` call answers); the calls to snapshot_download."""
    calls: list[dict[str, Any]] = []

    def snapshot_download(model_id: str, **kwargs: Any) -> str:
        calls.append({"model_id": model_id, **kwargs})
        if not online and not kwargs.get("local_files_only"):
            raise _HubError("connection refused")
        return str(folder)

    modelscope = types.ModuleType("modelscope")
    modelscope.snapshot_download = snapshot_download  # type: ignore[attr-defined]
    errors = types.ModuleType("modelscope_hub.errors")
    errors.HubError = _HubError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "modelscope", modelscope)
    monkeypatch.setitem(sys.modules, "modelscope_hub", types.ModuleType("modelscope_hub"))
    monkeypatch.setitem(sys.modules, "modelscope_hub.errors", errors)
    return calls


def test_a_modelscope_id_is_fetched_with_snapshot_download_at_its_revision(
    tiny_source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_modelscope(monkeypatch, tiny_source_dir)
    src = resolve("modelscope:BAAI/bge-small-zh-v1.5", "v1.0")
    assert (src.model, src.revision, src.local) == ("modelscope:BAAI/bge-small-zh-v1.5", "v1.0", False)
    assert src.folder == tiny_source_dir and src.weights_file == tiny_source_dir / "model.safetensors"
    # one download: the folder already has model.safetensors, so pytorch_model.bin is not fetched too
    [call] = calls
    assert call["model_id"] == "BAAI/bge-small-zh-v1.5" and call["revision"] == "v1.0"
    assert {"config.json", "vocab.txt", "model.safetensors"} <= set(call["allow_patterns"])
    assert "pytorch_model.bin" not in call["allow_patterns"]


def test_without_a_revision_modelscopes_default_branch_is_fetched_and_recorded(
    tiny_source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_modelscope(monkeypatch, tiny_source_dir)
    assert resolve("modelscope:tiansz/bert-base-chinese", None).revision == "master"
    assert calls[0]["revision"] == "master"


def test_a_checkpoint_without_safetensors_is_fetched_with_its_pytorch_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text("{}")
    calls = _fake_modelscope(monkeypatch, tmp_path)
    resolve("modelscope:tiansz/bert-base-chinese", None)
    assert len(calls) == 2 and calls[1]["allow_patterns"] == ["pytorch_model.bin"]


def test_unreachable_the_cached_snapshot_is_used(
    tiny_source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_modelscope(monkeypatch, tiny_source_dir, online=False)
    assert resolve("modelscope:BAAI/bge-small-zh-v1.5", None).folder == tiny_source_dir
    assert calls[-1]["local_files_only"] is True


def test_a_cached_snapshot_without_weights_is_not_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download cut short leaves part of a snapshot in the cache: unreachable, not half a model."""
    (tmp_path / "config.json").write_text("{}")
    _fake_modelscope(monkeypatch, tmp_path, online=False)
    with pytest.raises(HubUnreachableError, match="cannot reach ModelScope"):
        resolve("modelscope:BAAI/bge-small-zh-v1.5", None)


@pytest.mark.parametrize("bad", ["modelscope:", "modelscope:bert-base-chinese", "modelscope:a/b/c"])
def test_a_modelscope_id_is_org_slash_name(bad: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _fake_modelscope(monkeypatch, tmp_path)
    with pytest.raises(ExportError, match="modelscope:ORG/NAME"):
        resolve(bad, None)
    assert calls == []


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "modelscope", None)  # import modelscope raises ImportError
    with pytest.raises(ExportError, match=r"pip install 'zhembed\[modelscope\]'"):
        resolve("modelscope:BAAI/bge-small-zh-v1.5", None)
