"""Tests with the real client libraries, against the real test server: each library can send its own
request form to our routes and parse what they answer, and reads back exactly the route's answer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from huggingface_hub import FillMaskOutputElement, InferenceClient

from tests.app.conftest import Running

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
