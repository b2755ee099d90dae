"""Fine-tuned heads served as their references answer: /predict as transformers' text-classification
pipeline (top_k=None), /rerank as sentence-transformers' CrossEncoder.predict, /token-classification as
transformers' token-classification pipeline; a route the model cannot serve is a 4xx naming its kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.app.conftest import Running, serve_model
from tests.checkpoints import export, minilm_folder, save_head

pytestmark = pytest.mark.slow

SENTIMENT = ["negative", "neutral", "positive"]
TEXTS = [
    "I loved this film, the acting was wonderful.",
    "The service was slow and the food was cold.",
    "It is a phone.",
    "Absolutely terrible, I want my money back!",
    " ".join(f"long review sentence number {i}" for i in range(120)),  # over 512 tokens: truncate only
]
PAIRS = [
    ("How do I reset my password?", "Click 'forgot password' on the login page to get a reset link."),
    ("How do I reset my password?", "Our office is closed on public holidays."),
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
]
ENTITY_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
CHINESE = [
    "我叫王小明，住在北京市海淀区。",
    "阿里巴巴集团总部位于杭州。",
    "张三和李四去了上海参加华为的发布会。",
]
# Each head's int8 scores within this of PyTorch's (the export enforces the same on its validation set).
INT8_BOUND = 0.1


def _post(running: Running, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = httpx.post(running.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


# --- a sequence classifier -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_head(
        tmp_path_factory.mktemp("classifier"), minilm_folder(), "BertForSequenceClassification", SENTIMENT
    )


@pytest.fixture(scope="module")
def classifier_export(classifier_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(classifier_source, tmp_path_factory.mktemp("classifier-export") / "model", ("fp32", "int8"))


@pytest.fixture(scope="module")
def classify(classifier_source: Path) -> Any:
    from transformers import pipeline

    return pipeline("text-classification", model=str(classifier_source), top_k=None, device="cpu")


@pytest.fixture(scope="module", params=["fp32", "int8"])
def classifier(request: pytest.FixtureRequest, classifier_export: Path) -> Iterator[tuple[str, Running]]:
    for running in serve_model(classifier_export, request.param, cache_bytes=1 << 20):
        yield request.param, running


def _by_label(predictions: list[dict[str, Any]]) -> dict[str, float]:
    return {p["label"]: p["score"] for p in predictions}


def test_predict_equals_the_text_classification_pipeline(
    classifier: tuple[str, Running], classify: Any
) -> None:
    variant, running = classifier
    bound = 1e-3 if variant == "fp32" else INT8_BOUND
    expected = classify(TEXTS[:4])
    got = _post(running, "/predict", {"inputs": TEXTS[:4]})
    assert len(got) == 4
    for mine, theirs in zip(got, expected, strict=True):
        assert [p["score"] for p in mine] == sorted((p["score"] for p in mine), reverse=True)
        if variant == "fp32":
            assert [p["label"] for p in mine] == [p["label"] for p in theirs]
        ours, ref = _by_label(mine), _by_label(theirs)
        assert set(ours) == set(SENTIMENT)
        assert max(abs(ours[k] - ref[k]) for k in ref) <= bound, (variant, mine, theirs)
    # The head decides: not every input gets the same best label, and scores are not uniform.
    assert len({p[0]["label"] for p in expected}) > 1 or max(p[0]["score"] for p in expected) > 0.5
    # One input alone: its list, not a batch.
    one = _post(running, "/predict", {"inputs": TEXTS[0]})
    assert isinstance(one[0], dict)
    assert max(abs(_by_label(one)[k] - v) for k, v in _by_label(got[0]).items()) <= 1e-6


def test_predict_raw_scores_are_the_logits(classifier: tuple[str, Running], classifier_source: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    variant, running = classifier
    model = AutoModelForSequenceClassification.from_pretrained(classifier_source).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier_source)
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS[0], return_tensors="pt")).logits[0].numpy()
    got = _by_label(_post(running, "/predict", {"inputs": TEXTS[0], "raw_scores": True}))
    bound = 1e-3 if variant == "fp32" else 0.3
    assert max(abs(got[label] - float(logits[i])) for i, label in enumerate(SENTIMENT)) <= bound


def test_predict_pairs_and_the_tei_pair_rule(classifier: tuple[str, Running], classify: Any) -> None:
    variant, running = classifier
    if variant != "fp32":
        pytest.skip("pairs are checked once")
    a, b = PAIRS[0]
    expected = _by_label(classify({"text": a, "text_pair": b}))
    # A list of exactly two strings is one pair (TEI); a list of pairs is a batch.
    one = _by_label(_post(running, "/predict", {"inputs": [a, b]}))
    batch = _post(running, "/predict", {"inputs": [[a, b], TEXTS[0]]})
    assert max(abs(one[k] - expected[k]) for k in expected) <= 1e-3
    assert max(abs(_by_label(batch[0])[k] - expected[k]) for k in expected) <= 1e-3


def test_predict_refuses_an_over_long_input_unless_truncated(
    classifier: tuple[str, Running], classify: Any
) -> None:
    variant, running = classifier
    refused = httpx.post(running.url + "/predict", json={"inputs": TEXTS[4]}, timeout=60)
    assert refused.status_code == 422 and "inputs[0]" in refused.text and "truncate" in refused.text
    got = _by_label(_post(running, "/predict", {"inputs": TEXTS[4], "truncate": True}))
    expected = _by_label(classify([TEXTS[4]], truncation=True)[0])
    assert max(abs(got[k] - expected[k]) for k in expected) <= (1e-3 if variant == "fp32" else INT8_BOUND)


def test_predict_goes_through_the_cache_keyed_by_head(classifier: tuple[str, Running]) -> None:
    _, running = classifier
    engine = running.service.engine
    texts = ["cache me once", "and me", "me too"]
    first = _post(running, "/predict", {"inputs": texts})
    ran = engine.stats()["batched_items"]
    second = _post(running, "/predict", {"inputs": texts})
    assert first == second
    assert engine.stats()["batched_items"] == ran  # answered from the cache: nothing ran
    # A text and the same text in a pair are different keys.
    _post(running, "/predict", {"inputs": [["cache me once", "and me"]]})
    assert engine.stats()["batched_items"] == ran + 1
    # The same texts' embeddings are not the cached logits.
    vectors = _post(running, "/embed", {"inputs": ["cache me once"]})
    assert len(vectors[0]) == 384


def test_root_route_and_info_say_the_kind(classifier: tuple[str, Running]) -> None:
    _, running = classifier
    info = httpx.get(running.url + "/info").json()
    assert info["kind"] == "classifier" and "/predict" in info["routes"] and "/rerank" not in info["routes"]
    assert info["labels"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert info["architecture"] == "BertForSequenceClassification"
    root = _post(running, "/", {"inputs": TEXTS[0]})
    assert _by_label(root) == _by_label(_post(running, "/predict", {"inputs": TEXTS[0]}))


def test_routes_the_model_cannot_serve_name_its_kind(classifier: tuple[str, Running]) -> None:
    _, running = classifier
    for path, body in (
        ("/rerank", {"query": "q", "texts": ["a"]}),
        ("/token-classification", {"inputs": "a"}),
        ("/fill-mask", {"inputs": "a [MASK]"}),
    ):
        response = httpx.post(running.url + path, json=body, timeout=60)
        assert 400 <= response.status_code < 500, (path, response.text)
        assert response.json()["error_type"] == "unsupported", (path, response.text)
    rerank = httpx.post(running.url + "/rerank", json={"query": "q", "texts": ["a"]}, timeout=60)
    assert "sequence classifier" in rerank.text and "/predict" in rerank.text


def test_an_embedding_model_refuses_the_head_routes(client: httpx.Client) -> None:
    for path, body in (
        ("/predict", {"inputs": "a"}),
        ("/rerank", {"query": "q", "texts": ["a"]}),
        ("/token-classification", {"inputs": "a"}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        assert "an embedding model" in response.json()["error"]


# --- a multi-label classifier: sigmoid scores --------------------------------------------------------


def test_multi_label_classifier_scores_with_sigmoid(tiny_source_dir: Path, tmp_path: Path) -> None:
    from transformers import pipeline

    labels = ["体育", "财经", "科技", "娱乐"]
    source = save_head(
        tmp_path / "src",
        tiny_source_dir,
        "BertForSequenceClassification",
        labels,
        problem_type="multi_label_classification",
        std=0.5,
    )
    out = export(source, tmp_path / "model")
    reference = pipeline("text-classification", model=str(source), top_k=None, device="cpu")
    for running in serve_model(out, "fp32"):
        got = _post(running, "/predict", {"inputs": CHINESE})
        expected: list[Any] = reference(CHINESE)
        for mine, theirs in zip(got, expected, strict=True):
            assert max(abs(_by_label(mine)[k] - v) for k, v in _by_label(theirs).items()) <= 1e-3
        # Sigmoid: scores need not sum to 1.
        assert any(abs(sum(p["score"] for p in mine) - 1) > 1e-2 for mine in got)


# --- a cross-encoder ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reranker_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_head(
        tmp_path_factory.mktemp("reranker"),
        minilm_folder(),
        "BertForSequenceClassification",
        ["LABEL_0"],
        std=0.3,
    )


@pytest.fixture(scope="module")
def reranker_export(reranker_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(reranker_source, tmp_path_factory.mktemp("reranker-export") / "model", ("fp32", "int8"))


@pytest.fixture(scope="module", params=["fp32", "int8"])
def reranker(request: pytest.FixtureRequest, reranker_export: Path) -> Iterator[tuple[str, Running]]:
    for running in serve_model(reranker_export, request.param):
        yield request.param, running


def test_rerank_equals_cross_encoder_predict(reranker: tuple[str, Running], reranker_source: Path) -> None:
    from sentence_transformers import CrossEncoder

    variant, running = reranker
    query = "How do I reset my password?"
    texts = [t for _, t in PAIRS] + [" ".join(["password reset help"] * 200)]
    expected = CrossEncoder(str(reranker_source), device="cpu").predict([(query, t) for t in texts])
    ranks = _post(running, "/rerank", {"query": query, "texts": texts, "truncate": True, "return_text": True})
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    assert sorted(r["index"] for r in ranks) == list(range(len(texts)))
    bound = 1e-3 if variant == "fp32" else INT8_BOUND
    for r in ranks:
        assert r["text"] == texts[r["index"]]
        assert abs(r["score"] - float(expected[r["index"]])) <= bound, (variant, r, expected)
    if variant == "fp32":
        assert [r["index"] for r in ranks] == np.argsort(-expected, kind="stable").tolist()
    # Without truncation the long pair is refused, naming it.
    refused = httpx.post(running.url + "/rerank", json={"query": query, "texts": texts}, timeout=60)
    assert refused.status_code == 422 and "texts[3]" in refused.text


def test_rerank_raw_scores_and_predict_on_a_reranker(reranker: tuple[str, Running]) -> None:
    _, running = reranker
    query, text = PAIRS[2]
    (rank,) = _post(running, "/rerank", {"query": query, "texts": [text]})  # one text: its rank
    (raw,) = _post(running, "/rerank", {"query": query, "texts": [text], "raw_scores": True})
    assert "text" not in rank and abs(rank["score"] - 1 / (1 + np.exp(-raw["score"]))) <= 1e-6
    predicted = _post(running, "/predict", {"inputs": [query, text]})
    assert predicted[0]["label"] == "LABEL_0" and abs(predicted[0]["score"] - rank["score"]) <= 1e-6
    info = httpx.get(running.url + "/info").json()
    assert info["kind"] == "reranker" and "/rerank" in info["routes"]
    empty = httpx.post(running.url + "/rerank", json={"query": query, "texts": []}, timeout=60)
    assert empty.status_code == 400 and "texts is empty" in empty.text


# --- a tagger ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tagger_source(tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_head(
        tmp_path_factory.mktemp("tagger"),
        tiny_source_dir,
        "BertForTokenClassification",
        ENTITY_LABELS,
        std=1.0,
    )


@pytest.fixture(scope="module")
def tagger_export(tagger_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(tagger_source, tmp_path_factory.mktemp("tagger-export") / "model", ("fp32", "int8"))


@pytest.fixture(scope="module", params=["fp32", "int8"])
def tagger(request: pytest.FixtureRequest, tagger_export: Path) -> Iterator[tuple[str, Running]]:
    for running in serve_model(tagger_export, request.param):
        yield request.param, running


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_equals_the_pipeline(
    tagger: tuple[str, Running], tagger_source: Path, strategy: str
) -> None:
    from transformers import pipeline

    variant, running = tagger
    reference = pipeline(
        "token-classification", model=str(tagger_source), aggregation_strategy=strategy, device="cpu"
    )
    got = _post(running, "/token-classification", {"inputs": CHINESE, "aggregation_strategy": strategy})
    expected = reference(CHINESE)
    assert any(expected), "the seeded head finds entities"
    for mine, theirs in zip(got, expected, strict=True):
        if variant == "int8":  # int8 may flip a close call: scores of the entities both found
            both = {(e["start"], e["end"]): e for e in mine}
            matched = [(both[(t["start"], t["end"])], t) for t in theirs if (t["start"], t["end"]) in both]
            assert len(matched) >= 0.7 * len(theirs)
            for m, t in matched:
                assert abs(m["score"] - float(t["score"])) <= 0.1
            continue
        assert len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            key = "entity" if strategy == "none" else "entity_group"
            assert (m[key], m["word"], m["start"], m["end"]) == (t[key], t["word"], t["start"], t["end"])
            assert abs(m["score"] - float(t["score"])) <= 1e-3


def test_token_classification_in_the_inference_clients_shape(tagger: tuple[str, Running]) -> None:
    from huggingface_hub import InferenceClient

    variant, running = tagger
    if variant != "fp32":
        pytest.skip("the client is checked once")
    client = InferenceClient(model=running.url + "/token-classification")
    found = client.token_classification(CHINESE[0])
    direct = _post(running, "/token-classification", {"inputs": CHINESE[0]})
    assert [(e.entity_group, e.word, e.start, e.end) for e in found] == [
        (e["entity_group"], e["word"], e["start"], e["end"]) for e in direct
    ]
    # The root route of a tagger answers as /token-classification (aggregation "simple").
    assert _post(running, "/", {"inputs": CHINESE[0]}) == direct
    info = httpx.get(running.url + "/info").json()
    assert info["kind"] == "tagger" and info["routes"][-1] == "/token-classification"
    bad = httpx.post(
        running.url + "/token-classification",
        json={"inputs": "a", "aggregation_strategy": "longest"},
        timeout=60,
    )
    assert bad.status_code == 422 and "aggregation_strategy" in bad.text
    too_long = httpx.post(running.url + "/token-classification", json={"inputs": "长" * 200}, timeout=60)
    assert too_long.status_code == 422 and "truncate" in too_long.text
    cut = _post(running, "/token-classification", {"inputs": "长" * 200, "truncate": True})
    assert all(e["end"] <= 126 for e in cut)
