"""``loadtest/gpu_check.py`` has no GPU here; its CPU mode runs the same steps so the script cannot rot.
No timing thresholds: the targets live in the script's PASS/MISS lines, not here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest

from loadtest.corpus import load_corpus
from loadtest.gpu_check import Spec, bodies
from tests.loadtest.conftest import run_module


@pytest.mark.slow  # starts the service twice (1 and 2 workers) on the tiny model's fp16 graph: ~30 s
def test_gpu_check_runs_every_cell_on_the_cpu_provider(tiny_model_dir: Path, tmp_path: Path) -> None:
    # 8 clients, not 256: with 256 a request outlasts a short window on 2 busy cores, so the cell counts
    # nothing or a phase artefact. 1.5 s windows are over 3x the 8x32 p50 here (~0.4 s).
    out = tmp_path / "gpu-check.json"
    cpu = ["--provider", "CPUExecutionProvider", "--clients", "8", "--workers", "1,2"]
    short = ["--seconds", "1.5", "--warmup", "0.5", "--raw-seconds", "0.1"]
    args = ["--model", str(tiny_model_dir), *cpu, *short, "--out", str(out)]
    stdout = run_module("loadtest.gpu_check", *args)
    report = json.loads(out.read_text())
    assert report["parity_cosine_min"] > 0.99
    assert report["raw_ceiling"]["batch"] == 256 and report["raw_ceiling"]["seq"] == 32
    assert report["raw_ceiling"]["sentences_per_s"] > 0
    ran = [(c["label"], c["workers"]) for c in report["cells"]]
    assert ran == [("8x32", 1), ("8x32 base64", 1), ("8x1", 1), ("1x1", 1), ("8x32", 2)]
    for c in report["cells"]:
        assert c["errors"] == 0 and c["requests"] > 0, c
        assert c["status_counts"] == {"200": c["requests"]}, c
        assert c["workers_ready"] == c["workers"], c  # zhembed_workers_ready after the cell
        assert 1 <= c["mean_batch"] <= 256, c
        assert 0 < c["busy"] <= 1, c
        assert c["server_cores"] > 0, c
    for target in (
        r"8x32 >= 20,000 sentences/s: [\d,]+",
        r"8x32 >= 0.5 x raw ceiling: [\d.]+ \([\d,]+ / [\d,]+\)",
        r"8x32 p99 <= 2000 ms: \d+ ms",
        r"8x1 >= 5,000 requests/s: [\d,]+",
        r"1x1 p50 <= 4 ms: [\d.]+ ms",
        r"1x1 p99 <= 10 ms: [\d.]+ ms",
    ):
        assert re.search(r"\[(PASS|MISS)\] " + target, stdout), (target, stdout[-2000:])
    assert re.search(r"8x32 sentences/s by workers: 1: [\d,]+, 2: [\d,]+", stdout)
    assert re.search(r"^total: \d+ s$", stdout, re.MULTILINE)


def test_each_cell_sends_distinct_texts_in_its_encoding() -> None:
    corpus = load_corpus()
    seen: set[str] = set()
    sent = 0
    for spec, start in ((Spec(4, 32, "base64"), 0), (Spec(4, 1), 10_000_000)):
        make = bodies(corpus, spec, start)
        for n in range(2 * len(corpus) // spec.texts + 3):  # past the corpus's end, twice
            body, count = make(n)
            payload = orjson.loads(body)
            inputs = payload["inputs"] if spec.texts > 1 else [payload["inputs"]]
            assert count == len(inputs) == spec.texts
            assert payload.get("encoding", "float") == spec.encoding
            assert all(5 <= len(t) <= 120 for t in inputs)
            seen.update(inputs)
            sent += count
    assert len(seen) == sent  # not one text twice, across requests and cells
