"""``--format openai-batch``: killed with SIGKILL mid-run and run again, every custom_id is answered once,
each body what the live server's route answers for the same body; a torn last line is cut; a file of
another job is refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import orjson
import pytest

from app.bulk.batch_job import Refused, answer_in_order, manifest_path, written_prefix
from app.bulk.cli import main
from app.bulk.openai_batch import Answerer, Line
from tests.app.bulk.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[3]


def request_line(n: int) -> dict[str, Any]:
    """Request ``n``: a text, or (every fifth) two; every 1000th has an empty input (a 400 from the route)."""
    text = f"{n} 号：今天天气很好，我们去公园散步吧。" * (1 + n % 3)
    body: dict[str, Any] = {"model": "any", "input": [f"{n} 号", text] if n % 5 == 0 else text}
    if n % 1000 == 999:
        body["input"] = ""
    return {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/embeddings", "body": body}


def batch_args(model: Path, requests: Path, out: Path) -> list[str]:
    return [
        "--format",
        "openai-batch",
        "--model",
        str(model),
        "--variant",
        "fp32",
        "--intra-op-threads",
        "1",
        "--input",
        str(requests),
        "--output",
        str(out),
        "--progress",
        "off",
    ]


def read_output(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def assert_same_answer(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Two /v1/embeddings answers equal, the floats to 1e-6."""
    assert {k: v for k, v in got.items() if k != "data"} == {k: v for k, v in want.items() if k != "data"}
    assert [d["index"] for d in got["data"]] == [d["index"] for d in want["data"]]
    a = np.array([d["embedding"] for d in got["data"]])
    b = np.array([d["embedding"] for d in want["data"]])
    assert a.shape == b.shape and np.abs(a - b).max() <= 1e-6


def test_killed_mid_run_then_run_again_answers_every_custom_id_once_as_the_route_does(
    tiny_model_dir: Path, tmp_path: Path, client: httpx.Client
) -> None:
    requests = write_jsonl(tmp_path / "requests.jsonl", [request_line(n) for n in range(10_000)])
    out = tmp_path / "results.jsonl"
    job = subprocess.Popen(
        [sys.executable, "-m", "app.bulk", *batch_args(tiny_model_dir, requests, out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not out.exists() or out.read_bytes().count(b"\n") < 3000:
        assert job.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.wait()
    written_then = out.read_bytes().count(b"\n")
    assert 3000 <= written_then < 10_000
    assert orjson.loads(manifest_path(out).read_bytes())["status"] == "running"

    assert main(batch_args(tiny_model_dir, requests, out)) == 3  # 10 lines answered 400
    side = orjson.loads(manifest_path(out).read_bytes())
    assert side["runs"] == 2 and side["counts"] == {"lines": 10_000, "answered": 9_990, "failed": 10}
    answers = read_output(out)
    assert [a["custom_id"] for a in answers] == [f"req-{n}" for n in range(10_000)]  # each once, in order
    assert len({a["id"] for a in answers}) == 10_000
    for n in [0, 1, 5, written_then - 1, written_then, written_then + 1, 7_005, 9_999]:
        sent = request_line(n)["body"]
        live = client.post("/v1/embeddings", json=sent)
        response = answers[n]["response"]
        assert answers[n]["error"] is None and response["status_code"] == live.status_code
        if live.status_code == 200:
            assert_same_answer(response["body"], live.json())
        else:
            assert response["body"] == live.json()


@pytest.mark.parametrize("block", [3, 7, 18, 1 << 22])  # lines across blocks, and one block
def test_a_torn_last_line_is_cut_and_counted_out(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.bulk.batch_job.READ_BLOCK", block)
    out = tmp_path / "results.jsonl"
    out.write_bytes(b'{"custom_id":"a"}\n{"custom_id":"bb"}\n{"custom_id":"c","respo')
    assert written_prefix(out) == (2, "bb")
    assert out.read_bytes() == b'{"custom_id":"a"}\n{"custom_id":"bb"}\n'
    assert written_prefix(out) == (2, "bb")


def test_an_output_of_another_input_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    first = write_jsonl(tmp_path / "a.jsonl", [request_line(n) for n in range(3)])
    assert main(batch_args(tiny_model_dir, first, out)) == 0
    before = out.read_bytes()
    second = write_jsonl(tmp_path / "b.jsonl", [request_line(n) for n in range(4)])
    assert main(batch_args(tiny_model_dir, second, out)) == 2
    assert out.read_bytes() == before
    assert main([*batch_args(tiny_model_dir, second, out), "--overwrite"]) == 0
    assert [a["custom_id"] for a in read_output(out)] == [f"req-{n}" for n in range(4)]


def test_written_lines_that_answer_other_requests_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    from app.bulk.batch_job import todo
    from app.bulk.openai_batch import batch_routes, read_lines

    requests = write_jsonl(tmp_path / "requests.jsonl", [request_line(n) for n in range(3)])
    lines = read_lines(requests, batch_routes())
    with pytest.raises(Refused, match="line 2 answers custom_id 'other'"):
        list(todo(lines, 2, "other", tmp_path / "results.jsonl"))


class CountingAnswerer:
    """Stands in for the routes: counts the inputs of the lines being answered at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    async def answer(self, line: Line) -> tuple[bytes, bool]:
        self.now += line.inputs
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(0)
        self.now -= line.inputs
        return b"%d\n" % line.number, True


def test_lines_are_answered_in_order_with_at_most_window_inputs_in_flight() -> None:
    answerer = CountingAnswerer()
    lines = [Line(n, f"c{n}", "/v1/embeddings", b"{}", inputs=1 + n % 7) for n in range(1, 200)]

    async def run() -> list[bytes]:
        return [out async for out, _ in answer_in_order(cast(Answerer, answerer), iter(lines), 20)]

    assert asyncio.run(run()) == [b"%d\n" % n for n in range(1, 200)]
    assert 14 <= answerer.peak <= 20
