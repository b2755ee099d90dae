"""Tests with the real client libraries, against the real test server: each library can send its own
request form to our routes and parse what they answer, and reads back exactly the route's answer.

huggingface_hub's InferenceClient here (fill_mask, feature_extraction, sentence_similarity); the openai
client's tests are with the route they call, in ``test_openai_routes.py``.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from huggingface_hub import FillMaskOutputElement, InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.app.conftest import Running
from tests.app.vectors import assert_same_vectors

# --- huggingface_hub: fill-mask ---------------------------------------------------------------------

MASKED = "北京是中国的[MASK]都。"


def hf_fill_mask(server: Running) -> InferenceClient:
    # A URL as the model: the client calls it directly, with no Hub look-up. An explicit key because
    # without one the client reads HF_TOKEN or the saved Hugging Face login and would send a developer's
    # real token to the test server (token=False is refused by huggingface_hub 0.36); with no API keys
    # configured the server ignores it.
    return InferenceClient(model=server.url + "/fill-mask", api_key="not-a-hugging-face-token")


def fields(elements: list[FillMaskOutputElement]) -> list[dict[str, Any]]:
    """What the client parsed, as the route's JSON objects."""
    return [
        {"score": e.score, "token": e.token, "token_str": e.token_str, "sequence": e.sequence}
        for e in elements
    ]


def route_fill_mask(client: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.post("/fill-mask", json=body)
    assert response.status_code == 200, response.text
    answer: list[dict[str, Any]] = response.json()
    return answer


def test_hf_client_fill_mask_reads_the_routes_answer(server: Running, client: httpx.Client) -> None:
    got = hf_fill_mask(server).fill_mask(MASKED)
    want = route_fill_mask(client, {"inputs": MASKED})
    assert len(want) == 5  # the default top_k
    assert fields(got) == want


def test_hf_client_fill_mask_with_top_k(server: Running, client: httpx.Client) -> None:
    got = hf_fill_mask(server).fill_mask(MASKED, top_k=3)
    want = route_fill_mask(client, {"inputs": MASKED, "top_k": 3})
    assert len(want) == 3
    assert fields(got) == want


@pytest.mark.parametrize("top_k", [None, 1])
def test_hf_client_fill_mask_with_targets(server: Running, client: httpx.Client, top_k: int | None) -> None:
    targets = ["首", "国", "中国"]  # "中国" is not one token: its first, 中, stands in for it
    got = hf_fill_mask(server).fill_mask(MASKED, targets=targets, top_k=top_k)
    parameters: dict[str, Any] = {"targets": targets} | ({"top_k": top_k} if top_k else {})
    want = route_fill_mask(client, {"inputs": MASKED, "parameters": parameters})
    assert len(want) == (top_k or 3)
    assert {e["token_str"] for e in want} <= {"首", "国", "中"}
    assert fields(got) == want


# --- huggingface_hub: feature extraction and sentence similarity, through TEI's root route ------------

TEXTS = ["今天天气很好", "我爱北京天安门"]


def hf_root(server: Running) -> InferenceClient:
    # The server's own URL, as for text-embeddings-inference: the client posts to POST /.
    return InferenceClient(model=server.url, api_key="not-a-hugging-face-token")


def test_hf_client_feature_extraction_gets_the_embed_vectors(server: Running, client: httpx.Client) -> None:
    want = np.asarray(client.post("/embed", json={"inputs": TEXTS[0]}).json(), dtype=np.float32)
    got = hf_root(server).feature_extraction(TEXTS[0])
    assert got.shape == want.shape == (1, server.service.model.hidden_size)
    assert_same_vectors(got, want)


def test_hf_client_feature_extraction_passes_its_options(server: Running, client: httpx.Client) -> None:
    long = "北京是中华人民共和国的首都。" * 20  # over the tiny model's 128 tokens
    body = {"inputs": long, "normalize": False, "truncate": True, "truncation_direction": "left"}
    want = np.asarray(client.post("/embed", json=body).json(), dtype=np.float32)
    got = hf_root(server).feature_extraction(
        long, normalize=False, truncate=True, truncation_direction="Left"
    )
    assert_same_vectors(got, want)
    assert abs(float(np.linalg.norm(got)) - 1) > 1e-3  # not normalised, as asked


def test_hf_client_sentence_similarity_gets_the_similarity_scores(
    server: Running, client: httpx.Client
) -> None:
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": [TEXTS[1], TEXTS[0]]}}
    want = client.post("/similarity", json=body).json()
    got = hf_root(server).sentence_similarity(TEXTS[0], other_sentences=[TEXTS[1], TEXTS[0]])
    assert got == want and len(got) == 2 and got[1] == pytest.approx(1.0, abs=1e-5)


def test_hf_client_errors_are_readable(server: Running) -> None:
    with pytest.raises(HfHubHTTPError) as refused:
        hf_root(server).feature_extraction("   ")
    response = refused.value.response
    assert response is not None and response.status_code == 400
    assert "inputs is only whitespace" in response.text


def test_hf_client_prompt_name_is_refused_as_tei_refuses_an_unknown_prompt(server: Running) -> None:
    # Ignoring it would answer vectors without the prompt the caller asked for.
    with pytest.raises(HfHubHTTPError) as refused:
        hf_root(server).feature_extraction("你好", prompt_name="query")
    response = refused.value.response
    assert response is not None and response.status_code == 422
    assert "prompt_name 'query' is not one of this model's prompts" in response.text
