"""Sparse (SPLADE) vectors through every way in: ``POST /embed_sparse`` against sentence-transformers'
SparseEncoder, TEI's ``EmbedSparse`` and its stream (a client generated from the proto) against the HTTP
route, ``top_k``, the cache, and the refusals; on ``python -m app`` serving the export of a tiny
``SparseEncoder`` folder (MLMTransformer → SpladePooling("max"))."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import httpx
import numpy as np
import pytest

from export.validate import SPARSE_RELATIVE_FLOOR, SPARSE_RTOL, sparse_agreement
from loadtest.corpus import load_corpus
from loadtest.sparse_twin import mixed_lengths
from tests.app.api.rpc.grpc_process import Server, post, rpc_error, start_grpc_server, stop_grpc_server
from tests.app.conftest import serve_model

TEXTS = [
    "你好",
    "今天天气很好，我们去公园散步吧。",
    "北京是中华人民共和国的首都，有三千多年的建城史。",
    "这家餐厅的菜很好吃，服务也很周到，下次还会再来。",
    "机器学习和自然语言处理",
    "长城" * 20,
]
VOCAB = 21128


@pytest.fixture(scope="module")
def sparse_server(tiny_sparse_encoder: tuple[Path, Path]) -> Iterator[Server]:
    running = start_grpc_server(tiny_sparse_encoder[1], ZHEMBED_CACHE_BYTES=str(8 << 20))
    yield running
    stop_grpc_server(running)


def dense(answer: list[dict[str, float]]) -> np.ndarray:
    """One input's TEI-shaped answer as a [vocab] vector (zeros where it lists nothing)."""
    out = np.zeros(VOCAB, np.float32)
    for entry in answer:
        out[int(entry["index"])] = entry["value"]
    return out


def test_embed_sparse_equals_sentence_transformers_sparse_encoder(
    sparse_server: Server, tiny_sparse_encoder: tuple[Path, Path]
) -> None:
    """50 texts of mixed lengths (within the tiny model's 128 tokens), in fp32: the same non-zero indices
    (relu's 0 is SparseEncoder's only threshold), each weight within 1e-4 of itself. The two sum a logit's
    products in another order, so a weight under 1% of its vector's largest is held to 1e-4 of that 1%
    instead (export/validate.py, SPARSE_RTOL; measured: 4e-7 of the largest, docs/performance.md); an index
    one side has and the other not may only be such rounding of a logit at 0."""
    from sentence_transformers import SparseEncoder

    texts = mixed_lengths(load_corpus(), 50, max_chars=120)
    want = SparseEncoder(str(tiny_sparse_encoder[0]), device="cpu").encode(
        texts, convert_to_sparse_tensor=False
    )
    answer = post(sparse_server, "/embed_sparse", {"inputs": texts})
    assert len(answer) == len(texts)
    for entries in answer:
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices) and all(e["value"] > 0 for e in entries)  # zeros left out
    agreement = sparse_agreement(np.stack([dense(entries) for entries in answer]), want.numpy())
    assert agreement["max_rel_diff"] <= SPARSE_RTOL, agreement
    assert agreement["mismatch_weight_of_max"] <= SPARSE_RTOL * SPARSE_RELATIVE_FLOOR, agreement


def test_top_k_keeps_the_largest_weights_in_index_order(sparse_server: Server) -> None:
    everything = post(sparse_server, "/embed_sparse", {"inputs": TEXTS[1]})[0]
    top = post(sparse_server, "/embed_sparse", {"inputs": TEXTS[1], "top_k": 8})[0]
    assert len(top) == 8 and [e["index"] for e in top] == sorted(e["index"] for e in top)
    largest = sorted(everything, key=lambda e: -e["value"])[:8]
    assert {e["index"] for e in top} == {e["index"] for e in largest}
    assert post(sparse_server, "/embed_sparse", {"inputs": TEXTS[1], "top_k": 10**6})[0] == everything


def test_a_repeated_text_comes_from_the_cache_as_it_was_first_answered(sparse_server: Server) -> None:
    text = "缓存里的稀疏向量"

    def hits() -> float:
        metrics = httpx.get(sparse_server.url + "/metrics", timeout=30).text
        return sum(
            float(line.rpartition(" ")[2])
            for line in metrics.splitlines()
            if line.startswith("zhembed_cache_hits_total")
        )

    first = post(sparse_server, "/embed_sparse", {"inputs": [text]})
    before = hits()
    assert post(sparse_server, "/embed_sparse", {"inputs": [text, text]}) == first * 2
    assert hits() == before + 1  # one lookup: the repeat within the request is the same key
    # Another key space than /embed's: the dense vector of the same text is not served from it.
    assert len(post(sparse_server, "/embed", {"inputs": text})[0]) == 64


def test_without_the_cache_the_answers_are_the_same(
    sparse_server: Server, tiny_sparse_encoder: tuple[Path, Path]
) -> None:
    """A server without the cache takes ``top_k`` straight from the dense rows (nothing packed): the same
    bytes as the cached server's, a repeated text included, with and without ``top_k``."""
    texts = [TEXTS[1], TEXTS[2], TEXTS[1], TEXTS[4]]
    for running in serve_model(tiny_sparse_encoder[1], cache_bytes=0):
        for extra in ({}, {"top_k": 8}, {"top_k": 1}, {"top_k": 10**6}):
            body = {"inputs": texts, **extra}
            got = httpx.post(running.url + "/embed_sparse", json=body, timeout=60)
            assert got.status_code == 200, got.text
            want = httpx.post(sparse_server.url + "/embed_sparse", json=body, timeout=60)
            assert got.content == want.content, extra


def test_tei_embed_sparse_and_its_stream_equal_the_http_route(
    sparse_server: Server, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    embed = rpc.EmbedStub(sparse_server.channel)
    http = post(sparse_server, "/embed_sparse", {"inputs": TEXTS[:3]})
    for text, want in zip(TEXTS[:3], http, strict=True):
        got = embed.EmbedSparse(pb.EmbedSparseRequest(inputs=text))
        assert [(v.index, v.value) for v in got.sparse_embeddings] == [
            (e["index"], pytest.approx(e["value"], rel=1e-6)) for e in want
        ]
        assert got.metadata.compute_chars == len(text) and got.metadata.total_time_ns > 0
    streamed = list(embed.EmbedSparseStream(iter(pb.EmbedSparseRequest(inputs=t) for t in TEXTS[:3])))
    assert [[v.index for v in r.sparse_embeddings] for r in streamed] == [
        [e["index"] for e in w] for w in http
    ]


def test_over_long_inputs_bad_options_and_a_prompt_are_refused(
    sparse_server: Server, stubs: dict[str, ModuleType]
) -> None:
    long = "长城" * 100  # over the tiny model's 128 tokens
    refused = post(sparse_server, "/embed_sparse", {"inputs": long}, status=422)
    assert "inputs has 202 tokens" in refused["error"] and "truncate: true" in refused["error"]
    assert len(post(sparse_server, "/embed_sparse", {"inputs": long, "truncate": True})) == 1
    assert "top_k" in post(sparse_server, "/embed_sparse", {"inputs": "a", "top_k": 0}, status=422)["error"]
    assert post(sparse_server, "/embed_sparse", {"inputs": ""}, status=400)["error_type"] == "empty"
    post(sparse_server, "/embed_sparse", {"inputs": "a", "prompt_name": "query"}, status=422)
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    embed = rpc.EmbedStub(sparse_server.channel)
    error = rpc_error(embed.EmbedSparse, pb.EmbedSparseRequest(inputs=long))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "202 tokens" in (error.details() or "")
    error = rpc_error(embed.EmbedSparse, pb.EmbedSparseRequest(inputs="a", prompt_name="query"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_name" in (error.details() or "")


def test_info_lists_the_route_and_what_the_graph_computes(sparse_server: Server) -> None:
    info = httpx.get(sparse_server.url + "/info", timeout=30).json()
    assert "/embed_sparse" in info["routes"]
    assert info["sparse"] == {"pooling": "max", "activation": "relu"}


def test_sparse_requests_are_counted_under_their_own_route(
    sparse_server: Server, stubs: dict[str, ModuleType]
) -> None:
    def counted() -> dict[tuple[str, str], float]:
        """(route, protocol) → answered with 200 / OK, from zhembed_requests_total."""
        out: dict[tuple[str, str], float] = {}
        for line in httpx.get(sparse_server.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("zhembed_requests_total{") and (
                'status="200"' in line or 'status="OK"' in line
            ):
                labels = dict(
                    pair.split("=", 1) for pair in line[line.index("{") + 1 : line.index("}")].split(",")
                )
                key = (labels["route"].strip('"'), labels["protocol"].strip('"'))
                out[key] = out.get(key, 0.0) + float(line.rpartition(" ")[2])
        return out

    before = counted()
    post(sparse_server, "/embed_sparse", {"inputs": ["计数一次", "计数两次"]})
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    rpc.EmbedStub(sparse_server.channel).EmbedSparse(pb.EmbedSparseRequest(inputs="计数三次"))
    after = counted()
    grown = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    grown.pop(("/metrics", "http"), None)  # the first scrape
    assert grown == {("/embed_sparse", "http"): 1.0, ("/tei.v1.Embed/EmbedSparse", "grpc"): 1.0}, grown
