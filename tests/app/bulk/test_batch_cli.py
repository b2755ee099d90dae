"""``--format openai-batch`` takes each line's options from its body: the option flags are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.bulk.cli import main
from tests.app.bulk.test_batch_job import batch_args


@pytest.mark.parametrize("flag", [["--pooling", "cls"], ["--encoding", "int8"], ["--sparse"]])
def test_option_flags_are_refused_before_the_model_loads(
    flag: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}}\n'
    )
    out = tmp_path / "results.jsonl"
    assert main([*batch_args(tmp_path / "no-model", requests, out), *flag]) == 2
    assert "takes its options from each line's body" in capsys.readouterr().err
    assert not out.exists()
