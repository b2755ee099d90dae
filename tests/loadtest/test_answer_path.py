"""``loadtest/answer_path.py`` on the tiny model: every stage is timed on the service's own functions, and
the bodies it times are the ones /embed sends. No timing thresholds."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from loadtest import raw_onnx
from loadtest.answer_path import STAGES, cell
from tests.loadtest.conftest import run_module


@pytest.mark.slow  # ~5 s of interleaved rounds on the tiny model
def test_every_stage_is_timed_per_sentence_and_the_sum_is_the_path(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "answer-path.json"
    args = ["--model", str(tiny_model_dir), "--seconds", "0.5", "--cells", "16x4,1x1", "--width", "96"]
    stdout = run_module("loadtest.answer_path", *args, "--out", str(out))
    report = json.loads(out.read_text())
    assert report["width"] == 96
    assert [(c["rows"], c["per_request"]) for c in report["cells"]] == [(16, 4), (1, 1)]
    for c in report["cells"]:
        us = c["us_per_sentence"]
        assert set(us) == set(STAGES) and all(v > 0 for v in us.values()), us
        for e in ("float", "base64"):
            assert c["answer_path_us"][e] == pytest.approx(us["split"] + us["combine"] + us[e])
        # 96 float32 components: 512 base64 characters a vector, 2 quotes, and "[", "]" and commas a body
        n = c["per_request"]
        assert c["bytes_per_sentence"]["base64"] == pytest.approx(512 + 2 + (n + 1) / n)
        assert c["bytes_per_sentence"]["float"] > c["bytes_per_sentence"]["base64"]
    assert "   16x4" in stdout and "    1x1" in stdout


def test_the_vectors_it_encodes_are_unit_rows_of_the_batch_outputs(tiny_model_dir: Path) -> None:
    session = raw_onnx.open_encoder(tiny_model_dir, "fp32")
    layers = raw_onnx.shape_of(tiny_model_dir).layers
    got = cell(session, 4, 2, layers, 0.05, None)
    assert got["rows"] == 4 and got["per_request"] == 2
    fetch = raw_onnx.service_output(session)
    pooled = session.run([fetch], raw_onnx.synthetic_feed(4, 32))[0]
    unit = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    body = orjson.dumps(unit[:2], option=orjson.OPT_SERIALIZE_NUMPY)
    assert got["bytes_per_sentence"]["float"] == pytest.approx(len(body) / 2, abs=2)
    b64 = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in unit[:2]]
    assert got["bytes_per_sentence"]["base64"] == pytest.approx(len(orjson.dumps(b64)) / 2, abs=1)
