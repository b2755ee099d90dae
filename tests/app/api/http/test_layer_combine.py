"""layer_combine weighted and difference on /embed, /similarity and /embed_all: the same arithmetic as on
PyTorch's hidden states, 422s that say what is wrong, and vectors that go through the cache."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from app.settings import Settings
from tests.app.conftest import TorchReference, cosine, serving, with_cache

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都，有三千多年的建城史。"]


def pooled(torch_ref: TorchReference, text: str, pooling: str, layers: list[int]) -> list[np.ndarray]:
    states, _ = torch_ref.states(text)
    return [states[layer - 1][0] if pooling == "cls" else states[layer - 1].mean(axis=0) for layer in layers]


def embed(client: httpx.Client, **body: object) -> list[np.ndarray]:
    response = client.post("/embed", json=body)
    assert response.status_code == 200, response.text
    return [np.asarray(v, dtype=np.float32) for v in response.json()]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize(
    ("layers", "weights"), [([1, 2, 3], [1.0, 2.0, 1.0]), ([3, 1], [3, 1]), ([2], [7.5])]
)
def test_embed_weighted_equals_pytorch(
    client: httpx.Client, torch_ref: TorchReference, pooling: str, layers: list[int], weights: list[float]
) -> None:
    body = {"pooling": pooling, "layers": layers, "layer_combine": "weighted", "layer_weights": weights}
    got = embed(client, inputs=TEXTS, normalize=False, **body)
    for text, vector in zip(TEXTS, got, strict=True):
        parts = pooled(torch_ref, text, pooling, layers)
        want = np.sum([w * p for w, p in zip(weights, parts, strict=True)], axis=0) / sum(weights)
        assert cosine(vector, want) >= 0.99999
        np.testing.assert_allclose(vector, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("normalize", [True, False])
def test_embed_difference_equals_pytorch(
    client: httpx.Client, torch_ref: TorchReference, pooling: str, normalize: bool
) -> None:
    got = embed(
        client, inputs=TEXTS, pooling=pooling, layers=[-1, 1], layer_combine="difference", normalize=normalize
    )
    for text, vector in zip(TEXTS, got, strict=True):
        upper, lower = pooled(torch_ref, text, pooling, [3, 1])
        want = upper - lower
        want = want / np.linalg.norm(want) if normalize else want
        assert cosine(vector, want) >= 0.99999
        np.testing.assert_allclose(vector, want, rtol=1e-3, atol=1e-4)


PAIRS = [[TEXTS[0], TEXTS[1]], [TEXTS[1], TEXTS[2]]]


@pytest.mark.parametrize(
    ("options", "arithmetic"),
    [
        ({"layer_combine": "weighted", "layer_weights": [1, 3]}, lambda a, b: (a + 3 * b) / 4),
        ({"layer_combine": "difference"}, lambda a, b: a - b),
    ],
)
def test_similarity_scores_the_combined_vectors(
    client: httpx.Client, torch_ref: TorchReference, options: dict[str, object], arithmetic: Any
) -> None:
    response = client.post("/similarity", json={"pairs": PAIRS, "layers": [3, 2], **options})
    assert response.status_code == 200, response.text

    def vector(text: str) -> np.ndarray:
        return arithmetic(*pooled(torch_ref, text, "mean", [3, 2]))

    want = [cosine(vector(a), vector(b)) for a, b in PAIRS]
    np.testing.assert_allclose(response.json(), want, atol=1e-5)


BAD_COMBINATIONS: list[tuple[dict[str, object], list[str]]] = [
    ({"layers": [1, 2], "layer_combine": "weighted"}, ["needs layer_weights", "2"]),
    ({"layers": [1, 2], "layer_combine": "weighted", "layer_weights": [1.0]}, ["1 weights for 2 layers"]),
    ({"layer_combine": "weighted", "layer_weights": [1.0, 1.0]}, ["2 weights for 1 layers"]),
    (
        {"layers": [1, 2], "layer_combine": "weighted", "layer_weights": [1.0, -0.5]},
        ["layer_weights[1]", "≥ 0"],
    ),
    ({"layers": [1, 2], "layer_combine": "weighted", "layer_weights": [0, 0.0]}, ["all 0"]),
    ({"layers": [1, 2], "layer_combine": "mean", "layer_weights": [1.0, 2.0]}, ["'weighted' only", "mean"]),
    ({"layers": [1, 2], "layer_combine": "weighted", "layer_weights": ["1", "2"]}, ["layer_weights"]),
    ({"layer_combine": "difference"}, ["exactly two layers", "got 1"]),
    ({"layers": [1, 2, 3], "layer_combine": "difference"}, ["exactly two layers", "got 3"]),
    ({"layers": [1, 2], "layer_combine": "sum"}, ["layer_combine"]),
]


@pytest.mark.parametrize("route", ["/embed", "/similarity", "/embed_all"])
@pytest.mark.parametrize(("options", "words"), BAD_COMBINATIONS)
def test_bad_weights_and_layer_counts_give_422(
    client: httpx.Client, route: str, options: dict[str, object], words: list[str]
) -> None:
    body = {"pairs": [["你好", "您好"]]} if route == "/similarity" else {"inputs": "你好"}
    response = client.post(route, json={**body, **options})
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"
    for word in words:
        assert word in response.json()["error"]


@pytest.mark.parametrize("weight", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_weights_give_422(client: httpx.Client, weight: str) -> None:
    # Not standard JSON, but Python's parser reads these literals as floats.
    raw = (
        f'{{"inputs": "你好", "layers": [1, 2], "layer_combine": "weighted", "layer_weights": [1, {weight}]}}'
    )
    response = client.post("/embed", content=raw.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "layer_weights" in response.json()["error"]


def test_weighted_and_difference_go_through_the_cache(tiny_settings: Settings) -> None:
    text = ["缓存里的加权组合"]
    weighted = {"layers": [1, 3], "layer_combine": "weighted", "layer_weights": [1, 2]}
    with serving(with_cache(tiny_settings, None)) as running, httpx.Client(base_url=running.url) as client:

        def computed() -> int:
            return int(running.service.engine.stats()["batched_items"])

        first = embed(client, inputs=text, **weighted)[0]
        assert computed() == 1
        again = embed(client, inputs=text, **weighted)[0]
        scaled = embed(client, inputs=text, **{**weighted, "layer_weights": [2.5, 5.0]})[0]  # same weights
        assert computed() == 1 and first.tobytes() == again.tobytes() == scaled.tobytes()
        others = [
            embed(client, inputs=text, **{**weighted, "layer_weights": [2, 1]})[0],
            embed(client, inputs=text, layers=[1, 3], layer_combine="mean")[0],
            embed(client, inputs=text, layers=[1, 3], layer_combine="difference")[0],
            embed(client, inputs=text, layers=[3, 1], layer_combine="difference")[0],
        ]
        assert computed() == 5
        vectors = [first, *others]
        for i, vector in enumerate(vectors):
            for other in vectors[i + 1 :]:
                assert not np.allclose(vector, other)
        np.testing.assert_allclose(others[2], -others[3], atol=1e-6)  # normalised a - b is -(b - a)
        assert (
            embed(client, inputs=text, layers=[3, 1], layer_combine="difference")[0].tobytes()
            == others[3].tobytes()
        )
        assert computed() == 5
