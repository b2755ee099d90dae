"""Several models in ``python -m app``, a process of its own, on ONNX Runtime's one shared thread pool: its
answers equal each model's own single-model server; over gRPC the metadata ``model`` names the one that
answers (none: the default of the HTTP route the method is the twin of), each call equals its HTTP twin
on the same model, and a name that is not served is NOT_FOUND with the served names, as HTTP's 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import pytest

from app.model import pool
from app.settings import Settings
from tests.app.api.rpc.grpc_process import Server, f32, post, rpc_error, start_grpc_server, stop_grpc_server
from tests.app.conftest import serving
from tests.app.vectors import assert_same_answer, assert_same_vectors

TEXTS = ["今天天气很好", "北京是中国的首都。"]


@pytest.fixture(scope="module")
def three(tiny_model_dir: Path, tiny_reranker_dir: Path, tiny_tagger_dir: Path) -> Iterator[Server]:
    models = f"embed={tiny_model_dir},rerank={tiny_reranker_dir},ner={tiny_tagger_dir}"
    running = start_grpc_server(
        tiny_model_dir, ZHEMBED_MODELS=models, ZHEMBED_SHUTDOWN_DRAIN_S="0.2", ZHEMBED_INTRA_OP_THREADS="0"
    )
    yield running
    stop_grpc_server(running)


def test_the_shared_pool_has_every_physical_core_but_one(three: Server) -> None:
    """Unless the setting gives its size (here 0), and every model says so on /info."""
    info = httpx.get(three.url + "/info", timeout=10).json()
    assert [model["intra_op_threads"] for model in info["models"]] == [pool.threads(0)] * 3


def test_the_metadata_model_names_the_model_that_answers(three: Server, stubs: dict[str, ModuleType]) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    embed = rpc.EmbedStub(three.channel)
    default = f32(embed.Embed(pb.EmbedRequest(inputs=TEXTS[0])).embeddings)
    assert_same_vectors(default, f32(post(three, "/embed", {"inputs": TEXTS[0]})[0]))
    for model in ("rerank", "ner"):
        got = f32(embed.Embed(pb.EmbedRequest(inputs=TEXTS[0]), metadata=[("model", model)]).embeddings)
        assert_same_vectors(got, f32(post(three, "/embed", {"inputs": TEXTS[0], "model": model})[0]))
        assert abs(got - default).max() > 1e-3  # another model's vector, not the default's
    zpb, zrpc = stubs["zhembed_pb2"], stubs["zhembed_pb2_grpc"]
    ours = zrpc.ZhembedStub(three.channel).Embed(zpb.EmbedRequest(inputs=TEXTS), metadata=[("model", "ner")])
    http = post(three, "/embed", {"inputs": TEXTS, "model": "ner"})
    assert_same_vectors([f32(v.values) for v in ours.vectors], f32(http))


def test_a_method_without_a_named_model_takes_its_routes_default(
    three: Server, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    ranks = rpc.RerankStub(three.channel).Rerank(pb.RerankRequest(query="北京", texts=TEXTS)).ranks
    http = post(three, "/rerank", {"query": "北京", "texts": TEXTS})
    assert [(r.index, round(r.score, 5)) for r in ranks] == [(r["index"], round(r["score"], 5)) for r in http]
    (prediction,) = rpc.PredictStub(three.channel).Predict(pb.PredictRequest(inputs=TEXTS[0])).predictions
    assert abs(prediction.score - post(three, "/predict", {"inputs": TEXTS[0]})[0]["score"]) <= 1e-6
    info = rpc.InfoStub(three.channel)
    assert info.Info(pb.InfoRequest()).model_id == "embed"
    named = info.Info(pb.InfoRequest(), metadata=[("model", "rerank")])
    assert named.model_id == "rerank" and named.model_type == pb.MODEL_TYPE_RERANKER


def test_an_unknown_model_is_not_found_listing_the_served_ones(
    three: Server, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    error = rpc_error(
        rpc.EmbedStub(three.channel).Embed, pb.EmbedRequest(inputs="你好"), metadata=[("model", "x")]
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "no model 'x' here: this server serves 'embed', 'rerank', 'ner'"
    assert dict(error.trailing_metadata() or ())["error-type"] == "model_not_found"
    # Counted as a gRPC call by its status code, refused before any model was chosen; the others by model.
    text = httpx.get(three.url + "/metrics", timeout=30).text
    assert 'model="",protocol="grpc",route="/tei.v1.Embed/Embed",status="NOT_FOUND"' in text
    assert 'model="rerank",protocol="grpc",route="/tei.v1.Embed/Embed",status="OK"' in text


def test_on_the_shared_pool_each_model_answers_as_its_own_server(
    three: Server, tiny_model_dir: Path, tiny_reranker_dir: Path, tiny_tagger_dir: Path
) -> None:
    """The server of three runs every session on the process's one pool; each single-model server here, on
    a pool of its own: the same answers."""
    cases: list[tuple[Path, str, dict[str, Any], str | None]] = [
        (tiny_model_dir, "/embed", {"inputs": TEXTS}, None),
        (tiny_model_dir, "/fill-mask", {"inputs": "北京是中国的[MASK]都。"}, None),
        (tiny_reranker_dir, "/rerank", {"query": "北京", "texts": TEXTS, "return_text": True}, None),
        (tiny_reranker_dir, "/embed", {"inputs": TEXTS}, "rerank"),
        (tiny_tagger_dir, "/token-classification", {"inputs": TEXTS, "aggregation_strategy": "first"}, None),
    ]
    for folder, path, body, model in cases:
        settings = Settings(
            model=str(folder), variant="fp32", intra_op_threads=1, cache_bytes=0, max_wait_ms=2
        )
        with serving(settings) as alone:
            want = httpx.post(alone.url + path, json=body, timeout=60).json()
        named = {**body, "model": model} if model is not None else body
        assert_same_answer(post(three, path, named), want, f"{folder.parent.name}{path}")
