"""Reading a checkpoint's Matryoshka training from its config.json, as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.matryoshka import ANY_WIDTH, checked, declared, recorded
from export.source import ExportError


def _folder(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, None),
        ({"matryoshka_dimensions": [768, 256, 64]}, (768, 256, 64)),
        ({"is_matryoshka": True}, ANY_WIDTH),
        ({"is_matryoshka": False}, None),
        ({"matryoshka_dimensions": [], "is_matryoshka": True}, ANY_WIDTH),  # vLLM: an empty list says nothing
        ({"matryoshka_dimensions": []}, None),
        ({"matryoshka_dimensions": [256], "is_matryoshka": True}, (256,)),  # the list restricts
    ],
)
def test_config_keys_are_read_as_vllm_reads_them(
    tmp_path: Path, config: dict[str, object], expected: object
) -> None:
    assert declared(_folder(tmp_path, **config)) == expected


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"matryoshka_dimensions": "64"}, "matryoshka_dimensions must be a list of integers, not '64'"),
        ({"matryoshka_dimensions": [64, True]}, "matryoshka_dimensions must be a list of integers"),
        ({"is_matryoshka": "yes"}, "is_matryoshka must be true or false, not 'yes'"),
    ],
)
def test_keys_that_hold_something_else_are_refused(
    tmp_path: Path, config: dict[str, object], words: str
) -> None:
    with pytest.raises(ExportError, match=words):
        declared(_folder(tmp_path, **config))


def test_the_manifest_records_widths_widest_first_and_checks_them_against_the_vectors() -> None:
    assert recorded(None) == (False, None)
    assert recorded(ANY_WIDTH) == (True, None)
    assert recorded((64, 256, 64, 768)) == (True, [768, 256, 64])
    assert checked((64, 16), 64) == (True, [64, 16])
    with pytest.raises(
        ExportError, match=r"\[0\] do not fit this model's vectors of 64 dimensions: each must be 1\.\.64"
    ):
        checked((64, 0), 64)
