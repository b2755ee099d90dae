"""Several models in one service: which model answers a request (the one it names, else the route's
default), and a real server of three tiny models (an embedder, a cross-encoder and a token classifier)
whose every route answers as that model's own single-model server does; unknown names, /v1/models,
/info, per-model admission budgets and the metrics' model label."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.errors import UnknownModel
from app.model.runtime import load_model
from app.settings import Settings
from app.tasks.models import Models
from app.telemetry.context import CURRENT_MODEL
from tests.app.conftest import Running, gate_inference, metric, samples, serving, wait_until
from tests.app.vectors import assert_same_answer, assert_same_vectors

# --- the choice, on stand-ins ------------------------------------------------------------------------


class Stand:
    """What the choice reads of a model's service: its name, kind and routes."""

    def __init__(self, name: str, kind: str, routes: list[str]) -> None:
        self.served_name = name
        self.kind = kind
        self._routes = routes
        self.ready = True

    def routes(self) -> list[str]:
        return self._routes


EMBEDDING = ["/", "/embed", "/embed_all", "/similarity", "/v1/embeddings", "/tokenize"]


def stands() -> list[Any]:
    return [
        Stand("ner", "tagger", [*EMBEDDING, "/token-classification"]),
        Stand("embed", "embedding", [*EMBEDDING, "/fill-mask"]),
        Stand("rerank", "reranker", [*EMBEDDING, "/predict", "/rerank"]),
    ]


def test_a_route_without_a_named_model_gets_the_one_that_serves_it() -> None:
    models = Models(stands(), named=True)
    assert models.default("/rerank").served_name == "rerank"
    assert models.default("/predict").served_name == "rerank"
    assert models.default("/token-classification").served_name == "ner"
    assert models.default("/fill-mask").served_name == "embed"
    # Every kind serves the embedding routes: an embedding model is preferred, though listed second.
    assert models.default("/embed").served_name == "embed"
    assert models.default("/embeddings").served_name == "embed"  # /v1/embeddings' twin
    # A route no model serves: the first, which then says why it cannot.
    assert models.default("/embed_sparse").served_name == "ner"
    only_heads = Models(stands()[::2], named=True)
    assert only_heads.default("/embed").served_name == "ner"  # no embedding model: the first


def test_a_named_model_answers_and_an_unknown_name_is_a_404_listing_the_served_ones() -> None:
    models = Models(stands(), named=True)
    assert models.pick("rerank", "/embed").served_name == "rerank"
    assert CURRENT_MODEL.get() == "rerank"
    assert models.pick(None, "/rerank").served_name == "rerank"
    with pytest.raises(
        UnknownModel, match="no model 'nope' here: this server serves 'ner', 'embed', 'rerank'"
    ):
        models.pick("nope", "/embed")


def test_a_service_of_one_unnamed_model_takes_any_name() -> None:
    """OpenAI's clients send names of their own; a service of ZHEMBED_MODEL alone answers them as before."""
    (only,) = stands()[1:2]
    models = Models([only], named=False)
    assert models.pick("text-embedding-3-small", "/v1/embeddings") is only
    with pytest.raises(UnknownModel):
        models.get("text-embedding-3-small")  # /v1/models/{name} still says which it serves


# --- three tiny models in one process ------------------------------------------------------------------

TEXTS = ["今天天气很好", "北京是中国的首都。", "我叫王小明，住在北京市海淀区。"]
BUDGET = 16  # the embedder's admission budget in the server below


def _settings(**changes: Any) -> Settings:
    return Settings(variant="fp32", intra_op_threads=1, max_wait_ms=2, **changes)


@pytest.fixture(scope="module")
def three(tiny_model_dir: Path, tiny_reranker_dir: Path, tiny_tagger_dir: Path) -> Iterator[Running]:
    """The three in one process, in this one: the models loaded here each with a thread pool of its own.
    ONNX Runtime's one shared pool, which ``python -m app`` gives several models, would be this test
    process's for good, and ONNX Runtime then refuses every other session a pool of its own (the export's,
    the benchmarks'); servers in processes of their own run on it (tests/app/api/rpc/test_models.py,
    tests/app/model/test_runtime.py)."""
    models = f"embed={tiny_model_dir};max_concurrent_inputs={BUDGET},rerank={tiny_reranker_dir},ner={tiny_tagger_dir}"
    settings = _settings(models=models, cache_bytes=8 << 20, max_inputs_per_request=16)
    loaded = [load_model(own) for _, own in settings.model_entries()]
    with serving(settings, models=loaded) as running:
        yield running


@pytest.fixture(scope="module")
def singles(
    tiny_model_dir: Path, tiny_reranker_dir: Path, tiny_tagger_dir: Path
) -> Iterator[dict[str, Running]]:
    """Each model on a server of its own, as ZHEMBED_MODEL alone serves it."""
    folders = {"embed": tiny_model_dir, "rerank": tiny_reranker_dir, "ner": tiny_tagger_dir}
    with (
        serving(_settings(model=str(folders["embed"]), cache_bytes=0)) as embed,
        serving(_settings(model=str(folders["rerank"]), cache_bytes=0)) as rerank,
        serving(_settings(model=str(folders["ner"]), cache_bytes=0)) as ner,
    ):
        yield {"embed": embed, "rerank": rerank, "ner": ner}


def _post(running: Running, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(running.url + path, json=body, timeout=60)


# (route, body, the model that must answer it): with no model named, the route's default answers.
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/embed", {"inputs": TEXTS}, "embed"),
    ("/embed", {"inputs": TEXTS, "model": "rerank", "pooling": "cls"}, "rerank"),
    ("/embed", {"inputs": TEXTS[0], "model": "ner", "layers": [-1, -2]}, "ner"),
    ("/", {"inputs": TEXTS[:2]}, "embed"),
    ("/", {"inputs": TEXTS[2], "model": "ner"}, "ner"),
    ("/", {"inputs": [TEXTS[0]], "model": "rerank"}, "rerank"),
    ("/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}, "embed"),
    ("/similarity", {"pairs": [TEXTS[:2]], "model": "rerank"}, "rerank"),
    ("/embed_all", {"inputs": TEXTS[1], "model": "ner", "return_tokens": True}, "ner"),
    ("/tokenize", {"inputs": TEXTS, "model": "rerank"}, "rerank"),
    ("/fill-mask", {"inputs": "北京是中国的[MASK]都。"}, "embed"),
    ("/rerank", {"query": "北京的天气", "texts": TEXTS, "return_text": True}, "rerank"),
    ("/predict", {"inputs": [TEXTS[0], TEXTS[1]]}, "rerank"),
    ("/token-classification", {"inputs": TEXTS, "aggregation_strategy": "simple"}, "ner"),
    ("/token-classification", {"inputs": TEXTS[2], "aggregation_strategy": "none", "model": "ner"}, "ner"),
    ("/rerank", {"query": "北京", "texts": TEXTS, "model": "embed"}, "embed"),  # 400: not a reranker
    ("/embed_sparse", {"inputs": TEXTS[0]}, "embed"),  # 400: no model has the sparse graph
]


@pytest.mark.parametrize(("path", "body", "model"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_every_route_answers_as_that_models_own_server(
    three: Running, singles: dict[str, Running], path: str, body: dict[str, Any], model: str
) -> None:
    got = _post(three, path, body)
    want = _post(singles[model], path, {k: v for k, v in body.items() if k != "model"})
    assert got.status_code == want.status_code, (got.text, want.text)
    if want.status_code == 200:
        assert_same_answer(got.json(), want.json(), path)
    else:  # the same refusal, naming the model by its name here
        assert got.json()["error_type"] == want.json()["error_type"]
        assert f"({model})" in got.json()["error"]


def test_openai_embeddings_name_their_model(three: Running, singles: dict[str, Running]) -> None:
    for model in ("embed", "ner"):
        got = _post(three, "/v1/embeddings", {"input": TEXTS, "model": model})
        want = _post(singles[model], "/v1/embeddings", {"input": TEXTS, "model": "anything"})
        assert got.status_code == 200 and got.json()["model"] == model
        assert_same_vectors(
            [d["embedding"] for d in got.json()["data"]], [d["embedding"] for d in want.json()["data"]]
        )
    assert _post(three, "/v1/embeddings", {"input": "你好"}).json()["model"] == "embed"  # the default


def test_an_unknown_model_is_a_404_that_lists_the_served_ones(three: Running) -> None:
    served = "this server serves 'embed', 'rerank', 'ner'"
    for path, body in (("/embed", {"inputs": "你好"}), ("/rerank", {"query": "a", "texts": ["b"]})):
        refused = _post(three, path, {**body, "model": "bge-m3"})
        assert refused.status_code == 404, refused.text
        assert refused.json() == {
            "error": f"no model 'bge-m3' here: {served}",
            "error_type": "model_not_found",
        }
    openai = _post(three, "/v1/embeddings", {"input": "你好", "model": "text-embedding-3-small"})
    assert openai.status_code == 404
    assert openai.json()["error"]["code"] == "model_not_found" and served in openai.json()["error"]["message"]
    retrieved = httpx.get(three.url + "/v1/models/bge-m3", timeout=30)
    assert retrieved.status_code == 404 and served in retrieved.text


def test_models_and_info_list_every_model(three: Running) -> None:
    cards = httpx.get(three.url + "/v1/models", timeout=30).json()["data"]
    assert [c["id"] for c in cards] == ["embed", "rerank", "ner"]
    assert httpx.get(three.url + "/v1/models/ner", timeout=30).json()["id"] == "ner"
    info = httpx.get(three.url + "/info", timeout=30).json()
    assert info["model_id"] == "embed"  # the default model at the top, as a service of one shows it
    assert [(m["model_id"], m["kind"]) for m in info["models"]] == [
        ("embed", "embedding"),
        ("rerank", "reranker"),
        ("ner", "tagger"),
    ]
    # TEI's model_type, which Dify's TEI provider reads to tell an embedder from a reranker.
    types = [m["model_type"] for m in info["models"]]
    assert list(types[0]) == ["embedding"] and list(types[1]) == ["reranker"]
    assert list(types[2]) == ["token_classifier"]
    labels = types[1]["reranker"]["id2label"]
    assert types[1]["reranker"]["label2id"] == {v: int(k) for k, v in labels.items()}
    assert info["max_client_batch_size"] == info["max_inputs_per_request"]
    budgets = [m["batching"]["max_concurrent_inputs"] for m in info["models"]]
    assert budgets[0] == BUDGET and budgets[1] == budgets[2] == (512 - BUDGET) // 2  # the rest, shared
    assert info["default_models"]["/rerank"] == "rerank"
    assert info["default_models"]["/token-classification"] == "ner"
    assert info["default_models"]["/embed"] == "embed"
    assert httpx.get(three.url + "/ready", timeout=30).json() == {"ready": True}
    assert all(m["ready"] for m in info["models"])


def test_the_metrics_carry_the_model(three: Running) -> None:
    with httpx.Client(base_url=three.url, timeout=60) as client:
        for model in ("embed", "rerank", "ner"):
            for _ in range(2):  # the second time from that model's cache
                assert client.post("/embed", json={"inputs": "指标", "model": model}).status_code == 200
        for model in ("embed", "rerank", "ner"):
            labels = {"route": "/embed", "status": "200", "protocol": "http", "urgency": "3", "model": model}
            assert metric(client, "zhembed_requests_total", **labels) >= 1
            assert metric(client, "zhembed_batch_size_count", model=model) >= 1
            assert metric(client, "zhembed_tokenization_duration_seconds_count", model=model) >= 1
            assert metric(client, "zhembed_queue_duration_seconds_count", urgency="3", model=model) >= 1
            assert metric(client, "zhembed_cache_misses_total", tier="memory", model=model) >= 1
            assert metric(client, "zhembed_cache_hits_total", tier="memory", model=model) >= 1
            assert {dict(k)["model"] for k in samples(client, "zhembed_queue_depth")} == {
                "embed",
                "rerank",
                "ner",
            }
        refused = client.post("/embed", json={"inputs": "x", "model": "nope"})
        assert refused.status_code == 404
        labels = {"route": "/embed", "status": "404", "protocol": "http", "urgency": "3", "model": ""}
        assert metric(client, "zhembed_requests_total", **labels) >= 1  # refused before a model was chosen
        info = samples(client, "zhembed_model_info")
        assert sorted(dict(k)["model"] for k in info) == ["embed", "ner", "rerank"]


def test_a_flood_on_one_model_is_refused_with_its_name_and_leaves_the_others_budget(
    monkeypatch: pytest.MonkeyPatch, three: Running
) -> None:
    """The embedder's budget full (its batches held at the device): its next request is a 429 naming it,
    while the reranker, whose budget is its own, is still admitted."""
    embed = three.app.state.models.get("embed")
    rerank = three.app.state.models.get("rerank")
    gate = gate_inference(monkeypatch, Running(three.app, three.url))  # the default model's: embed's
    answers: list[int] = []

    def call(path: str, body: dict[str, Any]) -> None:
        answers.append(_post(three, path, body).status_code)

    texts = [f"洪水{i}" for i in range(BUDGET)]
    flood = threading.Thread(target=call, args=("/embed", {"inputs": texts}))
    flood.start()
    try:
        wait_until(lambda: embed.engine.admission.in_use == BUDGET)
        refused = _post(three, "/embed", {"inputs": "再来一个"})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"].startswith(
            f"model embed's budget is full: {BUDGET} of {BUDGET} inputs"
        )
        other = threading.Thread(target=call, args=("/rerank", {"query": "北京", "texts": ["北京今天晴"]}))
        other.start()
        wait_until(lambda: rerank.engine.admission.in_use == 1)  # admitted: it waits for the device only
    finally:
        gate.set()
    flood.join(timeout=60)
    other.join(timeout=60)
    assert sorted(answers) == [200, 200]
    assert embed.engine.admission.in_use == rerank.engine.admission.in_use == 0


def test_the_server_here_left_this_process_without_the_shared_pool(three: Running) -> None:
    """Every later session of this test process (an export's, a benchmark's) may still have its own pool."""
    from app.model import pool

    assert three.app.state.models.ready and not pool.made()
