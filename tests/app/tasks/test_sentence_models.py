"""sentence-transformers folders served with their own settings: with no options, /embed, /,
/v1/embeddings and /similarity answer what ``SentenceTransformer(folder).encode`` answers, truncation
included; request options still override; prompts work; /info says where the defaults came from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.app.conftest import Running, serve_model
from tests.checkpoints import export, minilm_folder, save_sentence_model

pytestmark = pytest.mark.slow

ENGLISH = [
    "A man is playing a guitar.",
    "The cat sits on the mat.",
    "How do I reset my password?",
    "Shares dropped steeply on Wall Street.",
    # Over all-MiniLM-L6-v2's max_seq_length of 256 tokens: encode truncates it.
    " ".join(f"word{i} is here" for i in range(120)),
]
CHINESE = [
    "今天天气很好，我们去公园散步吧。",
    "北京是中华人民共和国的首都。",
    "这家餐厅的菜很好吃，服务也很周到。",
    "Apple公司发布了新款iPhone。",
    # Over the tiny folders' max_seq_length of 32 tokens.
    "长城是中国古代的军事防御工程，" * 6,
]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(minilm_folder(), tmp_path_factory.mktemp("st-minilm") / "model", ("fp32", "int8"))


@pytest.fixture(scope="module")
def minilm_st() -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_folder()), device="cpu")


@pytest.fixture(scope="module", params=["fp32", "int8"])
def minilm_server(request: pytest.FixtureRequest, minilm_export: Path) -> Iterator[tuple[str, Running]]:
    for running in serve_model(minilm_export, request.param):
        yield request.param, running


def _post(running: Running, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(running.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_minilm_with_no_options_equals_encode_truncation_included(
    minilm_server: tuple[str, Running], minilm_st: Any
) -> None:
    variant, running = minilm_server
    reference = minilm_st.encode(ENGLISH)
    bound = 0.9999 if variant == "fp32" else 0.99
    for got in (
        np.array(_post(running, "/embed", {"inputs": ENGLISH})),
        np.array(_post(running, "/", {"inputs": ENGLISH})),
        np.array([d["embedding"] for d in _post(running, "/v1/embeddings", {"input": ENGLISH})["data"]]),
    ):
        cosines = _cosines(got, reference)
        assert cosines.min() >= bound, (variant, cosines)
    if variant == "fp32":
        np.testing.assert_allclose(got, reference, atol=1e-4)
    # Truncated at 512 tokens instead of its 256, the long text's vector differs: the check bites.
    minilm_st.max_seq_length = 512
    try:
        longer = minilm_st.encode([ENGLISH[-1]])
    finally:
        minilm_st.max_seq_length = 256
    assert _cosines(got[-1:], longer)[0] < 0.999


def test_minilm_similarity_equals_encode_cosines(minilm_server: tuple[str, Running], minilm_st: Any) -> None:
    variant, running = minilm_server
    ref = minilm_st.encode(ENGLISH)
    scores = _post(
        running, "/similarity", {"inputs": {"source_sentence": ENGLISH[0], "sentences": ENGLISH[1:]}}
    )
    expected = ref[1:] @ ref[0]
    np.testing.assert_allclose(scores, expected, atol=1e-4 if variant == "fp32" else 2e-2)


def test_request_options_still_override_the_model_defaults(minilm_server: tuple[str, Running]) -> None:
    _, running = minilm_server
    cls = np.array(_post(running, "/embed", {"inputs": ENGLISH[:2], "pooling": "cls", "normalize": False}))
    mean = np.array(_post(running, "/embed", {"inputs": ENGLISH[:2]}))
    assert not np.allclose(cls, mean, atol=1e-3)
    assert abs(float(np.linalg.norm(cls[0])) - 1.0) > 1e-2  # not normalised when asked not to be
    # truncate: false sent says TEI's "refuse", whatever the model's default.
    refused = httpx.post(running.url + "/embed", json={"inputs": ENGLISH[-1], "truncate": False}, timeout=60)
    assert refused.status_code == 422 and "limit of 256" in refused.text


def test_info_shows_the_defaults_and_where_they_came_from(minilm_server: tuple[str, Running]) -> None:
    _, running = minilm_server
    info = httpx.get(running.url + "/info").json()
    assert info["kind"] == "embedding"
    defaults = info["defaults"]
    assert defaults["source"] == "sentence-transformers"
    assert defaults["pooling"] == "mean" and defaults["normalize"] is True
    assert defaults["long_text"] == "truncate" and defaults["max_input_length"] == 256
    assert defaults["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert "max_seq_length" in defaults["sources"]["max_input_length"]


def test_a_model_without_prompts_refuses_prompt_name(minilm_server: tuple[str, Running]) -> None:
    _, running = minilm_server
    response = httpx.post(running.url + "/embed", json={"inputs": "hi", "prompt_name": "query"}, timeout=60)
    assert response.status_code == 422 and "defines none" in response.text


# --- the other settings, on the tiny BERT with the real bert-base-chinese vocab -------------------------

FOLDERS: dict[str, dict[str, Any]] = {
    # max pooling, a Tanh Dense, no Normalize, lower-casing, a default prompt
    "max_dense": {
        "pooling": "max",
        "dense": [(32, "Tanh", True)],
        "normalize": False,
        "do_lower_case": True,
        "prompts": {"query": "查询：", "passage": ""},
        "default_prompt_name": "query",
    },
    # weighted mean that leaves the prompt out of the pooling (include_prompt false)
    "weightedmean_no_prompt": {
        "pooling": "weightedmean",
        "include_prompt": False,
        "prompts": {"query": "为这个句子生成表示以用于检索："},
    },
    # [CLS] through two Dense modules (the second without bias), then Normalize
    "cls_two_dense": {"pooling": "cls", "dense": [(48, "ReLU", True), (16, "Identity", False)]},
    "mean_sqrt_len": {"pooling": "mean_sqrt_len_tokens", "normalize": False},
    "lasttoken": {"pooling": "lasttoken"},
}


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def tiny_st(
    request: pytest.FixtureRequest, tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any, Running]]:
    from sentence_transformers import SentenceTransformer

    name = request.param
    folder = save_sentence_model(tmp_path_factory.mktemp(f"st-{name}"), tiny_source_dir, **FOLDERS[name])
    # Every variant: the export validates the folder's pooling (in the graph) and Dense in each.
    out = export(folder, tmp_path_factory.mktemp(f"st-{name}-export") / "model", ("fp32", "fp16", "int8"))
    model = SentenceTransformer(str(folder), device="cpu")
    for running in serve_model(out):
        yield name, model, running


def test_each_setting_is_served_as_encode_serves_it(tiny_st: tuple[str, Any, Running]) -> None:
    name, model, running = tiny_st
    reference = model.encode(CHINESE)
    got = np.array(_post(running, "/embed", {"inputs": CHINESE}))
    assert got.shape == reference.shape, name
    assert _cosines(got, reference).min() >= 0.9999, (name, _cosines(got, reference))
    np.testing.assert_allclose(got, reference, atol=1e-4, rtol=1e-4)
    openai = _post(running, "/v1/embeddings", {"input": CHINESE})["data"]
    np.testing.assert_allclose(np.array([d["embedding"] for d in openai]), reference, atol=1e-4, rtol=1e-4)


def test_prompts_are_served_as_encode_applies_them(tiny_st: tuple[str, Any, Running]) -> None:
    name, model, running = tiny_st
    # sentence-transformers 5 saves its default prompts ("query", "document": empty) beside the folder's.
    prompts = {"query": "", "document": "", **FOLDERS[name].get("prompts", {})}
    for prompt_name in prompts:
        reference = model.encode(CHINESE, prompt_name=prompt_name)
        got = np.array(_post(running, "/embed", {"inputs": CHINESE, "prompt_name": prompt_name}))
        np.testing.assert_allclose(got, reference, atol=1e-4, rtol=1e-4, err_msg=f"{name} {prompt_name}")
    unknown = httpx.post(running.url + "/embed", json={"inputs": "你好", "prompt_name": "nope"}, timeout=60)
    assert unknown.status_code == 422 and repr(next(iter(prompts))) in unknown.text


def test_include_prompt_false_leaves_the_prompt_out_of_the_pooling(tiny_st: tuple[str, Any, Running]) -> None:
    name, _, running = tiny_st
    if FOLDERS[name].get("include_prompt", True):
        pytest.skip("this folder pools its prompt")
    with_prompt = np.array(_post(running, "/embed", {"inputs": CHINESE[:2], "prompt_name": "query"}))
    # The prompt changes the other tokens' states, so the vector differs from the bare text's too.
    bare = np.array(_post(running, "/embed", {"inputs": CHINESE[:2]}))
    assert not np.allclose(with_prompt, bare, atol=1e-4)
    chunked = httpx.post(
        running.url + "/embed",
        json={"inputs": "你好", "prompt_name": "query", "long_text": "chunk"},
        timeout=60,
    )
    assert chunked.status_code == 422 and "chunk" in chunked.text


def test_info_lists_the_folder_settings(tiny_st: tuple[str, Any, Running]) -> None:
    name, model, running = tiny_st
    defaults = httpx.get(running.url + "/info").json()["defaults"]
    config = FOLDERS[name]
    assert defaults["pooling"] == config["pooling"].replace("_tokens", "")
    assert defaults["normalize"] is config.get("normalize", True)
    assert defaults["dimensions"] == model.get_sentence_embedding_dimension()
    assert [d["out"] for d in defaults["dense"]] == [d[0] for d in config.get("dense", [])]
    assert defaults["prompt_name"] == config.get("default_prompt_name")
    assert defaults["max_input_length"] == 32


def test_a_plain_bert_folder_keeps_the_plain_defaults(client: httpx.Client) -> None:
    defaults = client.get("/info").json()["defaults"]
    assert defaults["source"] == "bert" and defaults["pooling"] == "mean" and defaults["normalize"] is True
    assert defaults["long_text"] == "error" and defaults["modules"] == []
