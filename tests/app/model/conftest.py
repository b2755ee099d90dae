"""Fixtures for the model-folder tests: exports as an older build left them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.model.manifest import MANIFEST_NAME


@pytest.fixture()
def old_export(tiny_model_dir: Path) -> Callable[[Path], Path]:
    """Writes a copy of the tiny export whose manifest is schema_version 1 (no pooled outputs declared)
    at the folder it is given, and returns that folder."""

    def write(folder: Path) -> Path:
        shutil.copytree(tiny_model_dir, folder)
        raw = json.loads((folder / MANIFEST_NAME).read_text())
        del raw["pooled_outputs"]
        (folder / MANIFEST_NAME).write_text(json.dumps({**raw, "schema_version": 1}))
        return folder

    return write
