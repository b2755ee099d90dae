"""``dimensions``, one option across the embedding routes and both gRPC packages: POST /embed, POST /
(both forms), /v1/embeddings, tei.v1 Embed (field 6) and zhembed.v1 Embed.

Where the model was trained for shorter vectors (a config.json listing ``matryoshka_dimensions``) each
answers the first components of the model's vector, normalised again, the same on every route; through
the cache too, which keeps whole vectors. Where it was not (a plain BERT), each refuses with the same
message. Both servers also serve HTTP, so one process answers every route.
"""

from __future__ import annotations

import base64
import re
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from tests.app.api.rpc.grpc_process import Server, f32, post, rpc_error
from tests.conftest import MATRYOSHKA_DIMENSIONS

TEXTS = ["今天天气很好", "北京是中国的首都。", "这家餐厅的菜很好吃，服务也很周到。"]


def _cut(vectors: np.ndarray, k: int) -> np.ndarray:
    cut = vectors[:, :k]
    return cut / np.linalg.norm(cut, axis=1, keepdims=True)


def _every_route(
    server: Server, stubs: dict[str, ModuleType], dimensions: int, **options: Any
) -> dict[str, Any]:
    """Each route's vectors for TEXTS with ``dimensions`` (and ``normalize`` if given), as float32."""
    pb, rpc, zpb, zrpc = (stubs[n] for n in ("tei_pb2", "tei_pb2_grpc", "zhembed_pb2", "zhembed_pb2_grpc"))
    body = {"inputs": TEXTS, "dimensions": dimensions, **options}
    tei = rpc.EmbedStub(server.channel)
    return {
        "/embed": f32(post(server, "/embed", body)),
        "/": f32(post(server, "/", body)),
        "tei.v1 Embed": f32(
            [tei.Embed(pb.EmbedRequest(inputs=t, dimensions=dimensions, **options)).embeddings for t in TEXTS]
        ),
        "tei.v1 EmbedStream": f32(
            [
                a.embeddings
                for a in tei.EmbedStream(
                    iter(pb.EmbedRequest(inputs=t, dimensions=dimensions, **options) for t in TEXTS)
                )
            ]
        ),
        "zhembed.v1 Embed": f32(
            [
                v.values
                for v in zrpc.ZhembedStub(server.channel)
                .Embed(zpb.EmbedRequest(inputs=TEXTS, dimensions=dimensions, **options))
                .vectors
            ]
        ),
    }


def test_info_says_which_widths_the_model_was_trained_for(matryoshka_server: Server, server: Server) -> None:
    trained = httpx.get(matryoshka_server.url + "/info").json()["defaults"]
    assert trained["matryoshka"] is True and trained["matryoshka_dimensions"] == MATRYOSHKA_DIMENSIONS
    assert trained["dimensions"] == 64
    plain = httpx.get(server.url + "/info").json()["defaults"]
    assert plain["matryoshka"] is False and plain["matryoshka_dimensions"] is None


@pytest.mark.parametrize("k", [16, 32])
def test_dimensions_keep_the_first_components_renormalised_on_every_route(
    matryoshka_server: Server, stubs: dict[str, ModuleType], k: int
) -> None:
    raw = f32(post(matryoshka_server, "/embed", {"inputs": TEXTS, "normalize": False}))
    want = _cut(raw, k)
    for route, got in _every_route(matryoshka_server, stubs, k).items():
        assert got.shape == (len(TEXTS), k), route
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=route)
    openai = post(matryoshka_server, "/v1/embeddings", {"input": TEXTS, "dimensions": k})
    np.testing.assert_allclose(f32([d["embedding"] for d in openai["data"]]), want, rtol=1e-5, atol=1e-6)
    # normalize false: the leading components as they are.
    for route, got in _every_route(matryoshka_server, stubs, k, normalize=False).items():
        np.testing.assert_allclose(got, raw[:, :k], rtol=1e-5, atol=1e-6, err_msg=route)


def test_encodings_and_similarity_apply_to_the_cut_vectors(
    matryoshka_server: Server, stubs: dict[str, ModuleType]
) -> None:
    zpb, zrpc = stubs["zhembed_pb2"], stubs["zhembed_pb2_grpc"]
    want = _cut(f32(post(matryoshka_server, "/embed", {"inputs": TEXTS, "normalize": False})), 16)
    encoded = post(matryoshka_server, "/embed", {"inputs": TEXTS, "dimensions": 16, "encoding": "base64"})
    np.testing.assert_allclose(
        f32([np.frombuffer(base64.b64decode(e), "<f4") for e in encoded]), want, rtol=1e-5, atol=1e-6
    )
    int8 = zrpc.ZhembedStub(matryoshka_server.channel).Embed(
        zpb.EmbedRequest(inputs=TEXTS, dimensions=16, encoding=zpb.ENCODING_INT8)
    )
    for vector, row in zip(int8.vectors, want, strict=True):
        values = np.frombuffer(vector.int8, dtype=np.int8)
        assert len(values) == 16
        np.testing.assert_allclose(values * vector.scale, row, atol=vector.scale)
    # The root route's similarity form: cosines of the cut vectors.
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}, "dimensions": 16}
    np.testing.assert_allclose(post(matryoshka_server, "/", body), want[1:] @ want[0], rtol=1e-5, atol=1e-6)


def _cache_hits(server: Server) -> float:
    metrics = httpx.get(server.url + "/metrics").text
    return sum(
        float(v) for v in re.findall(r'^zhembed_cache_hits_total\{tier="memory"\} (\S+)$', metrics, re.M)
    )


def test_dimensions_are_cut_from_the_cached_whole_vector(matryoshka_server: Server) -> None:
    texts = ["缓存里的整条向量", "再切成前十六维"]
    whole = f32(post(matryoshka_server, "/embed", {"inputs": texts}))  # computed, cached whole and normalised
    assert whole.shape == (2, 64)
    hits = _cache_hits(matryoshka_server)
    cut = f32(post(matryoshka_server, "/embed", {"inputs": texts, "dimensions": 16}))
    assert _cache_hits(matryoshka_server) == hits + 2  # both from the cache
    raw = f32(
        post(matryoshka_server, "/embed", {"inputs": texts, "normalize": False})
    )  # its own key: computed
    np.testing.assert_allclose(cut, _cut(raw, 16), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cut, _cut(whole, 16), rtol=1e-5, atol=1e-6)


def _refusals(server: Server, stubs: dict[str, ModuleType], dimensions: int) -> dict[str, str]:
    """What each route answers to ``dimensions``: its status and message."""
    pb, rpc, zpb, zrpc = (stubs[n] for n in ("tei_pb2", "tei_pb2_grpc", "zhembed_pb2", "zhembed_pb2_grpc"))
    answers: dict[str, str] = {}
    for path, body in (
        ("/embed", {"inputs": TEXTS, "dimensions": dimensions}),
        ("/", {"inputs": TEXTS[0], "dimensions": dimensions}),
        (
            "/ (similarity)",
            {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}, "dimensions": dimensions},
        ),
    ):
        error = post(server, path.split(" ")[0], body, 422)
        answers[path] = error["error"]
        assert error["error_type"] == "validation"
    openai = post(server, "/v1/embeddings", {"input": TEXTS, "dimensions": dimensions}, 422)["error"]
    assert openai["type"] == "invalid_request_error"
    answers["/v1/embeddings"] = openai["message"]
    tei = rpc.EmbedStub(server.channel)
    calls = {
        "tei.v1 Embed": lambda: tei.Embed(pb.EmbedRequest(inputs=TEXTS[0], dimensions=dimensions)),
        "tei.v1 EmbedStream": lambda: list(
            tei.EmbedStream(iter([pb.EmbedRequest(inputs=TEXTS[0], dimensions=dimensions)]))
        ),
        "zhembed.v1 Embed": lambda: zrpc.ZhembedStub(server.channel).Embed(
            zpb.EmbedRequest(inputs=TEXTS, dimensions=dimensions)
        ),
    }
    for name, call in calls.items():
        error = rpc_error(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        answers[name] = error.details()
    return answers


def test_a_model_not_trained_for_shorter_vectors_refuses_dimensions_alike_everywhere(
    server: Server, stubs: dict[str, ModuleType]
) -> None:
    for dimensions in (16, 0):
        answers = _refusals(server, stubs, dimensions)
        assert len(set(answers.values())) == 1, answers  # one message on every route and protocol
        message = answers["/embed"]
        assert message.startswith(f"dimensions {dimensions} is not supported: the vectors have 64 dimensions")
        assert (
            "not trained for shorter ones (Matryoshka)" in message
            and "leave dimensions out, or send 64" in message
        )


def test_its_own_width_is_taken_as_no_cut(server: Server, stubs: dict[str, ModuleType]) -> None:
    whole = f32(post(server, "/embed", {"inputs": TEXTS}))
    for route, got in _every_route(server, stubs, 64).items():
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6, err_msg=route)


def test_a_width_the_model_does_not_list_is_refused_alike_everywhere(
    matryoshka_server: Server, stubs: dict[str, ModuleType]
) -> None:
    answers = _refusals(matryoshka_server, stubs, 20)
    assert set(answers.values()) == {
        "dimensions 20 is not one this model was trained for: send one of 64, 32, 16"
    }
    assert set(_refusals(matryoshka_server, stubs, 65).values()) == {
        "dimensions 65 is out of range: the vectors have 64 dimensions; send 1..64"
    }
