"""/fill-mask against transformers' fill-mask pipeline on the same tiny model (fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.conftest import TorchReference


@pytest.fixture(scope="module")
def pipeline(torch_ref: TorchReference, tiny_source_dir: Path) -> Any:
    from transformers import BertForMaskedLM
    from transformers import pipeline as make

    # The pipeline wants a *ForMaskedLM; it reads the same MLM head weights as BertForPreTraining.
    model = BertForMaskedLM.from_pretrained(tiny_source_dir).eval()
    return make("fill-mask", model=model, tokenizer=torch_ref.tokenizer, framework="pt")


def per_mask(result: Any) -> list[list[dict[str, Any]]]:
    """The pipeline answers a flat list for one mask; make it one list per mask like ours."""
    return [result] if result and isinstance(result[0], dict) else result


@pytest.mark.parametrize("text", ["今天[MASK]气很好。", "北京是[MASK]国的首都", "[MASK]天[MASK]气很[MASK]"])
def test_fill_mask_top_k_equals_the_pipeline(client: httpx.Client, pipeline: Any, text: str) -> None:
    response = client.post("/fill-mask", json={"inputs": text, "top_k": 5})
    assert response.status_code == 200, response.text
    (ours,) = response.json()
    theirs = per_mask(pipeline(text, top_k=5))
    assert len(ours) == len(theirs) == text.count("[MASK]")
    for got, want in zip(ours, theirs, strict=True):
        assert [p["token"] for p in got] == [p["token"] for p in want]
        assert [p["token_str"] for p in got] == [p["token_str"] for p in want]
        assert [p["sequence"] for p in got] == [p["sequence"] for p in want]
        for g, w in zip(got, want, strict=True):
            assert g["score"] == pytest.approx(w["score"], rel=1e-3)


def test_fill_mask_several_inputs_keep_their_order(client: httpx.Client, pipeline: Any) -> None:
    texts = ["今天[MASK]气很好。", "我[MASK]你", "北京是中[MASK]的首都，[MASK]海是"]
    response = client.post("/fill-mask", json={"inputs": texts, "top_k": 3})
    assert response.status_code == 200
    for text, ours in zip(texts, response.json(), strict=True):
        theirs = per_mask(pipeline(text, top_k=3))
        assert [[p["token"] for p in m] for m in ours] == [[p["token"] for p in m] for m in theirs]


@pytest.mark.parametrize("top_k", [1, 50])
def test_fill_mask_top_k_bounds(client: httpx.Client, top_k: int) -> None:
    response = client.post("/fill-mask", json={"inputs": "我[MASK]你", "top_k": top_k})
    assert response.status_code == 200
    assert len(response.json()[0][0]) == top_k
