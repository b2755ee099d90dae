"""The clients retrieval stacks use, pointed at a live server of an embedder and a cross-encoder: the
``cohere`` SDK's ClientV2, LangChain's CohereRerank and CohereEmbeddings (``langchain-cohere``),
LlamaIndex's JinaRerank and CohereRerank. Each answer equals /embed's vectors or /rerank's scores.

Offline: every client is given this server's URL; LangChain's tracing is off, and any other address is
sent to a proxy that does not exist, so a client that phoned home would fail the test.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from tests.app.conftest import Running

QUERY = "北京的天气怎么样"
DOCS = ["今天北京天气晴朗。", "上海地铁几点停运？", "我叫王小明，住在北京市海淀区。", "质量不太行，做工很快"]
KEY = "offline-test-key"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, two: Running) -> None:
    """No client reaches anything but the test server (a dead proxy for every other address)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    for name in ("LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING"):
        monkeypatch.setenv(name, "false")
    monkeypatch.setenv("COHERE_API_KEY", KEY)


def _post(two: Running, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(two.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _scores(two: Running, docs: list[str] = DOCS) -> list[tuple[int, float]]:
    ranks = _post(two, "/rerank", {"query": QUERY, "texts": docs, "truncate": True})
    return [(r["index"], r["score"]) for r in ranks]


def test_cohere_client_v2_embeds_every_type_as_embed_encodes(two: Running) -> None:
    import cohere

    client = cohere.ClientV2(api_key=KEY, base_url=two.url)
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    answer = client.embed(model="embed", texts=DOCS, input_type="search_document", embedding_types=types)
    got = answer.embeddings

    def embed(encoding: str) -> Any:
        return _post(two, "/embed", {"inputs": DOCS, "encoding": encoding})

    # JSON's numbers as float32 on both sides (the SDK reads them as Python floats).
    assert np.array_equal(np.asarray(got.float_, np.float32), np.asarray(embed("float"), np.float32))
    int8 = [v["values"] for v in embed("int8")]
    assert got.int8 == int8
    assert got.uint8 == [[x + 128 for x in v] for v in int8]
    assert got.binary == embed("binary")
    assert got.ubinary == embed("ubinary")
    assert got.base64 == embed("base64")
    assert answer.texts == DOCS


def test_cohere_client_v2_reranks_with_the_rerank_scores(two: Running) -> None:
    import cohere

    client = cohere.ClientV2(api_key=KEY, base_url=two.url)
    answer = client.rerank(model="rerank", query=QUERY, documents=DOCS, top_n=3)
    assert [(r.index, r.relevance_score) for r in answer.results] == _scores(two)[:3]


def test_cohere_client_v2_reads_the_errors(two: Running) -> None:
    import cohere
    from cohere.core.api_error import ApiError

    client = cohere.ClientV2(api_key=KEY, base_url=two.url)
    with pytest.raises(ApiError) as caught:
        client.rerank(model="embed", query=QUERY, documents=DOCS)
    assert caught.value.status_code == 400
    assert "cross-encoder" in str(caught.value.body["message"])


def test_langchain_cohere_rerank_gives_the_rerank_scores(two: Running) -> None:
    from langchain_cohere import CohereRerank

    reranker = CohereRerank(model="rerank", base_url=two.url, top_n=2)
    got = reranker.rerank(documents=DOCS, query=QUERY)
    assert [(r["index"], r["relevance_score"]) for r in got] == _scores(two)[:2]


def test_langchain_cohere_embeddings_give_the_embed_vectors(two: Running) -> None:
    from langchain_cohere import CohereEmbeddings

    embeddings = CohereEmbeddings(model="embed", base_url=two.url)  # type: ignore[call-arg]
    want = np.asarray(_post(two, "/embed", {"inputs": DOCS}), np.float32)
    assert np.array_equal(np.asarray(embeddings.embed_documents(DOCS), np.float32), want)
    query = np.asarray(embeddings.embed_query(QUERY), np.float32)
    assert np.array_equal(query, np.asarray(_post(two, "/embed", {"inputs": [QUERY]})[0], np.float32))


def _nodes() -> list[Any]:
    from llama_index.core.schema import NodeWithScore, TextNode

    return [NodeWithScore(node=TextNode(text=d, id_=str(i))) for i, d in enumerate(DOCS)]


def test_llama_index_jina_rerank_gives_the_rerank_scores(two: Running) -> None:
    from llama_index.core.schema import QueryBundle
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    reranker = JinaRerank(model="rerank", base_url=f"{two.url}/v1", api_key=KEY, top_n=3)
    got = reranker.postprocess_nodes(_nodes(), QueryBundle(QUERY))
    assert [(int(n.node.id_), n.score) for n in got] == _scores(two)[:3]


def test_llama_index_cohere_rerank_gives_the_rerank_scores(two: Running) -> None:
    from llama_index.core.schema import QueryBundle
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(model="rerank", base_url=two.url, api_key=KEY, top_n=3)
    got = reranker.postprocess_nodes(_nodes(), QueryBundle(QUERY))
    assert [(int(n.node.id_), n.score) for n in got] == _scores(two)[:3]
