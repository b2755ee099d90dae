"""The pooled vectors the graph computes (``cls_{i}`` / ``mean_{i}`` outputs) give the same answers as
pooling the per-token states in numpy, the path every export before them took: for every combination of
the options that change a vector, through the whole service and its wire encodings."""

from __future__ import annotations

import base64
import copy
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from app.settings import Settings
from tests.app.conftest import Running, serving

SHORT = ["今天天气很好", "北京是中国的首都。", "我们去公园散步吧"]
# Over the tiny model's 128 tokens: truncated or cut into windows.
LONG = "北京是中华人民共和国的首都，也是一座历史悠久的城市。" * 8


@pytest.fixture(scope="module")
def server(tiny_settings: Settings) -> Iterator[Running]:
    """The graph's pooling. Both servers plan by the constant cost model, so that the same request is
    batched the same way by both: a batch cut another way computes in another order, and the float32
    rounding that moves is of the size these comparisons hold the pooling paths to."""
    with serving(tiny_settings.model_copy(update={"measure_batch_cost": False})) as running:
        yield running


@pytest.fixture(scope="module")
def numpy_pooling(server: Running) -> Iterator[Running]:
    """The same model and settings, with the graph's pooled outputs hidden: pooled in numpy."""
    model = copy.copy(server.service.model)
    model.pooled_output = lambda layer, mode: None  # type: ignore[method-assign]
    with serving(server.service.settings, model) as running:
        yield running


def bodies() -> Iterator[dict[str, Any]]:
    layer_sets: list[list[int] | None] = [None, [1], [2, -1], [1, 2, 3]]
    for pooling, layers, combine, normalize, encoding, long_text in itertools.product(
        ["cls", "mean", "pooler"],
        layer_sets,
        ["concat", "mean", "weighted", "difference"],
        [True, False],
        ["float", "base64", "int8"],
        ["truncate", "chunk"],
    ):
        if pooling == "pooler" and layers is not None:
            continue  # the pooler reads the last layer only
        count = len(layers) if layers else 1
        if (combine == "difference" and count != 2) or (combine != "concat" and count == 1):
            continue  # not a combination the API accepts (or one that is plain concat)
        body: dict[str, Any] = {
            "inputs": [*SHORT, LONG],
            "pooling": pooling,
            "layer_combine": combine,
            "normalize": normalize,
            "encoding": encoding,
            "long_text": long_text,
        }
        if layers is not None:
            body["layers"] = layers
        if combine == "weighted":
            body["layer_weights"] = [float(k + 1) for k in range(count)]
        yield body


def decoded(item: Any, encoding: str) -> np.ndarray:
    if encoding == "float":
        return np.asarray(item, dtype=np.float64)
    if encoding == "base64":
        return np.frombuffer(base64.b64decode(item), dtype="<f4").astype(np.float64)
    return np.asarray(item["values"], dtype=np.float64) * item["scale"]


def tolerance(body: dict[str, Any]) -> float:
    """1e-6, but for a normalised difference of layers: the mean states of two neighbouring layers differ
    by a vector ~8x shorter than either, so scaling it to unit length scales the float32 rounding of the
    pooled means (~3e-7: ONNX Runtime and numpy sum in different orders) by as much. Unnormalised, the
    same difference is held to 1e-6."""
    return 2.5e-6 if body["layer_combine"] == "difference" and body["normalize"] else 1e-6


def test_both_paths_really_differ_in_what_they_fetch(server: Running, numpy_pooling: Running) -> None:
    assert server.service.engine.inference.pooled_names  # cls_i and mean_i of every layer
    assert not numpy_pooling.service.engine.inference.pooled_names


def test_every_option_combination_answers_as_numpy_pooling_does(
    server: Running, numpy_pooling: Running
) -> None:
    cases = list(bodies())
    assert len(cases) > 100
    with (
        httpx.Client(base_url=server.url, timeout=60) as graph,
        httpx.Client(base_url=numpy_pooling.url, timeout=60) as reference,
    ):
        for body in cases:
            got, want = graph.post("/embed", json=body), reference.post("/embed", json=body)
            assert got.status_code == want.status_code == 200, (body, got.text, want.text)
            rows, expected = got.json(), want.json()
            assert len(rows) == len(expected) == 4
            for g, w in zip(rows, expected, strict=True):
                a, b = decoded(g, body["encoding"]), decoded(w, body["encoding"])
                if body["encoding"] == "int8":
                    # One quantisation step at most, where a value sits on a rounding boundary.
                    assert g["scale"] == pytest.approx(w["scale"], rel=1e-5, abs=1e-7), body
                    np.testing.assert_allclose(a, b, atol=1.01 * w["scale"] + 1e-6, err_msg=str(body))
                else:
                    np.testing.assert_allclose(a, b, rtol=0, atol=tolerance(body), err_msg=str(body))


def test_similarity_and_openai_answer_as_numpy_pooling_does(server: Running, numpy_pooling: Running) -> None:
    requests: list[tuple[str, dict[str, Any]]] = [
        (
            "/similarity",
            {"inputs": {"source_sentence": SHORT[0], "sentences": [*SHORT[1:], LONG]}, "truncate": True},
        ),
        (
            "/similarity",
            {"pairs": [[SHORT[0], SHORT[1]], [SHORT[2], SHORT[0]]], "pooling": "cls", "layers": [1]},
        ),
        ("/v1/embeddings", {"input": SHORT, "model": "x"}),
    ]
    with (
        httpx.Client(base_url=server.url, timeout=60) as graph,
        httpx.Client(base_url=numpy_pooling.url, timeout=60) as reference,
    ):
        for path, body in requests:
            got, want = graph.post(path, json=body), reference.post(path, json=body)
            assert got.status_code == want.status_code == 200, (path, got.text, want.text)
            if path == "/v1/embeddings":
                a = [d["embedding"] for d in got.json()["data"]]
                b = [d["embedding"] for d in want.json()["data"]]
            else:
                a, b = got.json(), want.json()
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=path)
