"""/fill-mask against transformers' fill-mask pipeline on the same tiny model (fp32): the same shapes,
tokens, strings and (to ONNX Runtime's precision) scores, with and without targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.schemas.fill_mask import MAX_TARGETS
from tests.app.conftest import TorchReference


@pytest.fixture(scope="module")
def pipeline(torch_ref: TorchReference, tiny_source_dir: Path) -> Any:
    from transformers import BertForMaskedLM
    from transformers import pipeline as make

    # The pipeline wants a *ForMaskedLM; it reads the same MLM head weights as BertForPreTraining.
    model = BertForMaskedLM.from_pretrained(tiny_source_dir).eval()
    return make("fill-mask", model=model, tokenizer=torch_ref.tokenizer, framework="pt")


def assert_same(ours: Any, theirs: Any) -> None:
    """``ours`` has the pipeline's shape (lists nested alike, candidates where it has them) and values:
    tokens and strings exactly, scores to 1e-3 (ONNX Runtime against PyTorch)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs)
        assert {k: ours[k] for k in ("token", "token_str", "sequence")} == {
            k: theirs[k] for k in ("token", "token_str", "sequence")
        }
        assert ours["score"] == pytest.approx(theirs["score"], rel=1e-3)
        return
    assert isinstance(ours, list) and isinstance(theirs, list), (ours, theirs)
    assert len(ours) == len(theirs)
    for got, want in zip(ours, theirs, strict=True):
        assert_same(got, want)


def fill(client: httpx.Client, body: dict[str, Any]) -> Any:
    response = client.post("/fill-mask", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("text", ["今天[MASK]气很好。", "北京是[MASK]国的首都"])
def test_a_string_with_one_mask_answers_a_flat_list_like_the_pipeline(
    client: httpx.Client, pipeline: Any, text: str
) -> None:
    ours = fill(client, {"inputs": text, "top_k": 5})
    assert len(ours) == 5 and all(isinstance(p, dict) for p in ours)
    assert_same(ours, pipeline(text, top_k=5))


def test_a_string_with_several_masks_answers_a_list_per_mask_like_the_pipeline(
    client: httpx.Client, pipeline: Any
) -> None:
    text = "[MASK]天[MASK]气很[MASK]"
    ours = fill(client, {"inputs": text, "top_k": 5})
    assert len(ours) == 3 and all(len(m) == 5 for m in ours)
    assert_same(ours, pipeline(text, top_k=5))


def test_a_list_answers_each_input_in_the_pipelines_shape(client: httpx.Client, pipeline: Any) -> None:
    texts = ["今天[MASK]气很好。", "北京是中[MASK]的首都，[MASK]海是", "我[MASK]你"]
    ours = fill(client, {"inputs": texts, "top_k": 3})
    assert isinstance(ours[0][0], dict) and isinstance(ours[1][0], list)  # one mask; two masks
    assert_same(ours, pipeline(texts, top_k=3))


def test_a_list_of_one_input_answers_a_list_unlike_the_pipeline(client: httpx.Client, pipeline: Any) -> None:
    # The pipeline unwraps a list of one input; we keep one answer per input of a list.
    ours = fill(client, {"inputs": ["我[MASK]你"], "top_k": 3})
    assert_same(ours, [pipeline(["我[MASK]你"], top_k=3)])


@pytest.mark.parametrize(
    ("text", "targets", "top_k"),
    [
        ("今天[MASK]气很好。", ["天", "空", "日", "人"], 3),  # vocabulary tokens, fewer than given
        ("今天[MASK]气很好。", ["天", "天", "空"], 5),  # duplicates count once; top_k capped at 2
        ("北京是[MASK]国的首都", ["中国", "美国", "x"], 5),  # not tokens: their first token stands in
        ("北京是[MASK]国的首都", "中", 5),  # one target as a string
        ("[MASK]天[MASK]气很好", ["今", "明", "昨"], 2),  # several masks
    ],
)
def test_targets_score_like_the_pipelines(
    client: httpx.Client, pipeline: Any, text: str, targets: str | list[str], top_k: int
) -> None:
    ours = fill(client, {"inputs": text, "parameters": {"targets": targets, "top_k": top_k}})
    assert_same(ours, pipeline(text, targets=targets, top_k=top_k))


def test_parameters_top_k_is_the_top_level_top_k(client: httpx.Client) -> None:
    text = "我[MASK]你"
    top = fill(client, {"inputs": text, "top_k": 7})
    assert len(top) == 7
    assert fill(client, {"inputs": text, "parameters": {"top_k": 7}}) == top
    assert fill(client, {"inputs": text, "top_k": 7, "parameters": {"top_k": 7}}) == top


def test_empty_parameters_change_nothing(client: httpx.Client) -> None:
    text = "我[MASK]你"
    plain = fill(client, {"inputs": text})
    assert len(plain) == 5  # the default top_k
    assert fill(client, {"inputs": text, "parameters": {}}) == plain


def assert_422(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error_type"] == "validation"
    for word in words:
        assert word in body["error"], body["error"]


def test_two_different_top_k_are_refused(client: httpx.Client) -> None:
    body = {"inputs": "我[MASK]你", "top_k": 3, "parameters": {"top_k": 4}}
    assert_422(client.post("/fill-mask", json=body), "give top_k once")


@pytest.mark.parametrize("targets", [[" "], ["", "  "]])
def test_targets_without_any_token_are_refused(client: httpx.Client, targets: list[str]) -> None:
    body = {"inputs": "我[MASK]你", "parameters": {"targets": targets}}
    assert_422(client.post("/fill-mask", json=body), "none of the targets")


@pytest.mark.parametrize(
    "parameters",
    [
        {"targets": []},
        {"targets": ["a"] * (MAX_TARGETS + 1)},
        {"targets": [1]},
        {"targets": "字" * 8193},  # over max_input_chars, like an input
        {"top_k": 0},
        {"top_k": 51},
        {"top_k": "5"},
    ],
)
def test_parameters_out_of_bounds_are_refused(client: httpx.Client, parameters: dict[str, Any]) -> None:
    body = {"inputs": "我[MASK]你", "parameters": parameters}
    assert_422(client.post("/fill-mask", json=body), next(iter(parameters)))


@pytest.mark.parametrize("top_k", [1, 50])
def test_fill_mask_top_k_bounds(client: httpx.Client, top_k: int) -> None:
    assert len(fill(client, {"inputs": "我[MASK]你", "top_k": top_k})) == top_k
