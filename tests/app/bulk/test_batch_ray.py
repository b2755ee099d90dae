"""``--format openai-batch --ray`` on a local Ray: the same answers as the single-machine job, in input
order, the lines no route sees included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from app.bulk.batch_job import manifest_path
from app.bulk.cli import main
from app.cache.keys import model_digest
from tests.app.bulk.test_batch_job import batch_args, read_output, request_line
from tests.app.bulk.test_ray_job import local_ray  # noqa: F401  # the module's Ray, started once

pytestmark = pytest.mark.usefixtures("local_ray")


def test_the_ray_path_answers_what_the_single_machine_job_answers(
    tiny_model_dir: Path, tiny_model: Any, tmp_path: Path
) -> None:
    lines = [orjson.dumps(request_line(n)) for n in range(600)]  # more than one map_batches batch
    lines[7] = b"{not json"
    lines[300] = orjson.dumps(request_line(3))  # a repeated custom_id
    lines[450] = orjson.dumps({**request_line(450), "body": {"input": ""}})  # the route's 400
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n".join(lines) + b"\n")
    on_ray, alone = tmp_path / "ray.jsonl", tmp_path / "alone.jsonl"
    assert main([*batch_args(tiny_model_dir, requests, on_ray), "--ray"]) == 3
    assert main(batch_args(tiny_model_dir, requests, alone)) == 3
    a, b = read_output(on_ray), read_output(alone)
    assert [(x["id"], x["custom_id"], x["error"]) for x in a] == [
        (x["id"], x["custom_id"], x["error"]) for x in b
    ]
    assert len(a) == 600 and a[7]["error"]["code"] == "invalid_json"
    assert a[300]["error"]["code"] == "duplicate_custom_id" and a[450]["response"]["status_code"] == 400
    for x, y in zip(a, b, strict=True):
        assert x["response"]["status_code"] == y["response"]["status_code"]
        if x["response"]["status_code"] != 200:
            assert x["response"]["body"] == y["response"]["body"]
            continue
        got, want = x["response"]["body"], y["response"]["body"]
        assert got["usage"] == want["usage"] and got["model"] == want["model"]
        u = np.array([d["embedding"] for d in got["data"]])
        v = np.array([d["embedding"] for d in want["data"]])
        assert u.shape == v.shape and np.abs(u - v).max() <= 1e-6
    # The driver names the model from its manifest alone (it loads none), as the loaded model names it:
    # the digest its cache keys hold, the name its answers carry, and --model as given.
    ray_model, alone_model = (
        orjson.loads(manifest_path(out).read_bytes())["model"] for out in (on_ray, alone)
    )
    assert ray_model == alone_model
    assert ray_model["digest"] == model_digest(tiny_model.manifest, tiny_model.variant)
    assert ray_model["variant"] == tiny_model.variant == "fp32"
    assert ray_model["name"] == next(
        x["response"]["body"]["model"] for x in b if x["response"]["status_code"] == 200
    )
    assert ray_model["source"] == str(tiny_model_dir)
