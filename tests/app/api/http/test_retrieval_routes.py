"""Jina's and Cohere's rerank, Cohere's embed and TEI's /decode on a live server of an embedder and a
cross-encoder: each answer in its API's shape, with /rerank's scores and /embed's vectors."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.app.conftest import Running

QUERY = "北京的天气怎么样"
DOCS = ["今天北京天气晴朗。", "上海地铁几点停运？", "我叫王小明，住在北京市海淀区。", "质量不太行，做工很快"]
LONG = "北京是中华人民共和国的首都。" * 20  # past the tiny models' 128 tokens
CORPUS = Path(__file__).parents[4] / "loadtest" / "data" / "corpus_zh.txt"


@pytest.fixture()
def http(two: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=two.url, timeout=60) as c:
        yield c


def _ok(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _tei_ranks(client: httpx.Client, docs: list[str]) -> list[tuple[int, float]]:
    ranks = _ok(client, "/rerank", {"query": QUERY, "texts": docs, "truncate": True})
    return [(r["index"], r["score"]) for r in ranks]


def test_jina_rerank_gives_rerank_scores_in_jinas_shape(http: httpx.Client) -> None:
    answer = _ok(http, "/v1/rerank", {"model": "rerank", "query": QUERY, "documents": DOCS})
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == _tei_ranks(http, DOCS)
    assert [r["document"] for r in answer["results"]] == [
        {"text": DOCS[r["index"]]} for r in answer["results"]
    ]
    assert answer["model"] == "rerank"
    assert answer["usage"]["total_tokens"] > sum(len(d) for d in DOCS)


def test_cohere_rerank_keeps_top_n_and_takes_document_objects(http: httpx.Client) -> None:
    body = {"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2}
    answer = _ok(http, "/v2/rerank", body)
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == _tei_ranks(http, DOCS)[:2]
    assert all("document" not in r for r in answer["results"])
    assert answer["meta"]["billed_units"]["search_units"] == 1
    with_docs = _ok(http, "/v2/rerank", {**body, "return_documents": True})
    assert with_docs["results"][0]["document"] == {"text": DOCS[with_docs["results"][0]["index"]]}


def test_rerank_takes_documents_in_place_of_texts(http: httpx.Client) -> None:
    texts = _ok(http, "/rerank", {"query": QUERY, "texts": DOCS})
    documents = _ok(http, "/rerank", {"query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]})
    assert documents == texts
    both = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "documents": DOCS})
    assert both.status_code == 422, both.text
    assert "not both" in both.json()["error"]


def test_max_tokens_per_doc_ranks_each_documents_first_tokens(http: httpx.Client) -> None:
    # Chinese: one token a character, so the first 3 tokens are the first 3 characters.
    answer = _ok(http, "/v2/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 3})
    cut = [d[:3] for d in DOCS]
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == _tei_ranks(http, cut)
    assert answer["meta"]["billed_units"]["input_tokens"] == len(DOCS) * (len(QUERY) + 3 + 3)


def test_over_long_documents_are_truncated_as_rerank_truncates(http: httpx.Client) -> None:
    answer = _ok(http, "/v1/rerank", {"query": QUERY, "documents": [LONG, DOCS[0]]})
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == _tei_ranks(
        http, [LONG, DOCS[0]]
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "key"),
    [
        ("/v1/rerank", {"documents": DOCS}, 422, "detail"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "detail"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "model": "embed"}, 400, "detail"),
        ("/v2/rerank", {"query": QUERY, "documents": [1]}, 422, "message"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, 422, "message"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCS, "model": "nope"}, 404, "message"),
        ("/v2/embed", {"texts": DOCS, "input_type": "image"}, 422, "message"),
        ("/v2/embed", {"texts": [LONG], "truncate": "NONE"}, 422, "message"),
        ("/v2/embed", {"texts": DOCS, "embedding_types": ["int4"]}, 422, "message"),
        ("/v1/embed", {"texts": []}, 400, "message"),
        ("/decode", {"ids": [[101, 10**6]]}, 422, "error"),
        ("/decode", {"ids": [[101]] * 129}, 422, "error"),
        ("/decode", {"ids": "101"}, 422, "error"),
    ],
)
def test_errors_take_each_apis_shape(
    http: httpx.Client, path: str, body: dict[str, Any], status: int, key: str
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    message = response.json()[key]
    assert isinstance(message, str) and message


def test_cohere_embed_gives_every_type_of_the_embed_vectors(http: httpx.Client) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    answer = _ok(
        http, "/v2/embed", {"texts": DOCS, "input_type": "search_document", "embedding_types": types}
    )
    got = answer["embeddings"]
    assert answer["texts"] == DOCS and answer["response_type"] == "embeddings_by_type"
    assert answer["meta"]["billed_units"]["input_tokens"] == sum(len(d) + 2 for d in DOCS)

    def embed(encoding: str) -> Any:
        return _ok(http, "/embed", {"inputs": DOCS, "encoding": encoding})

    assert got["float"] == embed("float")
    assert got["int8"] == [v["values"] for v in embed("int8")]
    assert got["uint8"] == [[x + 128 for x in v["values"]] for v in embed("int8")]
    assert got["binary"] == embed("binary")
    assert got["ubinary"] == embed("ubinary")
    assert got["base64"] == embed("base64")
    floats = [np.frombuffer(base64.b64decode(b), "<f4").tolist() for b in got["base64"]]
    assert np.allclose(floats, got["float"])


@pytest.mark.parametrize(("truncate", "direction"), [("END", "right"), ("START", "left")])
def test_cohere_truncate_cuts_the_end_it_names(http: httpx.Client, truncate: str, direction: str) -> None:
    text = "天气很好。" * 30 + LONG
    got = _ok(http, "/v2/embed", {"texts": [text], "truncate": truncate})["embeddings"]["float"]
    body = {"inputs": [text], "long_text": "truncate", "truncation_direction": direction}
    assert got == _ok(http, "/embed", body)


def test_cohere_v1_embed_answers_floats_in_v1s_shape(http: httpx.Client) -> None:
    answer = _ok(http, "/v1/embed", {"texts": DOCS[:2], "model": "embed"})
    assert answer["response_type"] == "embeddings_floats"
    assert answer["embeddings"] == _ok(http, "/embed", {"inputs": DOCS[:2]})


def test_decode_round_trips_tokenize_for_100_chinese_texts(http: httpx.Client) -> None:
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:100]
    ids = [[t["id"] for t in row] for row in _ok(http, "/tokenize", {"inputs": texts})]
    decoded = _ok(http, "/decode", {"ids": ids, "skip_special_tokens": False})
    assert decoded[0].startswith("[CLS]") and decoded[0].endswith("[SEP]")
    again = _ok(http, "/tokenize", {"inputs": decoded, "add_special_tokens": False})
    assert [[t["id"] for t in row] for row in again] == ids
    # Without the special tokens, each text as the tokenizer normalised it ([UNK] aside): BERT's decoder
    # joins tokens with spaces, and the text's own spaces are not all kept, so compare without them.
    unk = _ok(http, "/tokenize", {"inputs": "[UNK]", "add_special_tokens": False})[0][0]["id"]
    plain = _ok(http, "/decode", {"ids": ids})
    known = [i for i, row in enumerate(ids) if unk not in row]
    assert len(known) > 50
    assert [plain[i].replace(" ", "") for i in known] == [texts[i].replace(" ", "").lower() for i in known]
