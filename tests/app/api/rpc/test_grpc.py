"""gRPC beside HTTP, through a real client generated from the project's protos (conftest.py; as a user of
text-embeddings-inference's proto would generate theirs), against ``python -m app`` in a process of its
own (its generated modules and ours must not meet in one protobuf descriptor pool).

The same Service answers both protocols: each call equals its HTTP route, errors carry the HTTP route's
message under the status code of the one error table, API keys and overload behave alike, metrics count
gRPC calls with ``protocol="grpc"``, health and reflection answer, and SIGTERM drains gRPC as it drains
HTTP.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from tests.app.api.rpc.grpc_process import (
    KEY,
    Server,
    f32,
    post,
    rpc_error,
    start_grpc_server,
    stop_grpc_server,
)
from tests.app.conftest import metric, wait_until
from tests.app.vectors import BATCHING_TOLERANCE, assert_same_bits, assert_same_vectors

TEXTS = ["今天天气很好", "北京是中国的首都。", "你好", "这家餐厅的菜很好吃，服务也很周到。"]


def test_tei_embed_equals_post_embed_with_the_same_options(
    server: Server, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    embed = rpc.EmbedStub(server.channel)
    for normalize in (True, False):
        for direction, name in (
            (pb.TRUNCATION_DIRECTION_RIGHT, "right"),
            (pb.TRUNCATION_DIRECTION_LEFT, "left"),
        ):
            text = "长城" * 100  # over the tiny model's 128 tokens: truncated one way or the other
            got = embed.Embed(
                pb.EmbedRequest(
                    inputs=text, truncate=True, normalize=normalize, truncation_direction=direction
                )
            )
            body = {"inputs": text, "truncate": True, "normalize": normalize, "truncation_direction": name}
            assert_same_vectors(f32(got.embeddings), f32(post(server, "/embed", body)[0]))
            assert got.metadata.compute_chars == len(text) and got.metadata.total_time_ns > 0


def test_tei_embed_without_normalize_is_normalised_as_post_embed(
    server: Server, stubs: dict[str, ModuleType]
) -> None:
    # TEI's normalize is optional, unset meaning true: a client generated from TEI's proto sends nothing.
    pb, rpc, zpb, zrpc = (stubs[n] for n in ("tei_pb2", "tei_pb2_grpc", "zhembed_pb2", "zhembed_pb2_grpc"))
    embed = rpc.EmbedStub(server.channel)
    unset = f32(embed.Embed(pb.EmbedRequest(inputs=TEXTS[1])).embeddings)
    assert abs(float(np.linalg.norm(unset)) - 1) < 1e-5
    assert_same_vectors(unset, f32(post(server, "/embed", {"inputs": TEXTS[1]})[0]))
    raw = f32(embed.Embed(pb.EmbedRequest(inputs=TEXTS[1], normalize=False)).embeddings)
    assert_same_vectors(raw, f32(post(server, "/embed", {"inputs": TEXTS[1], "normalize": False})[0]))
    assert abs(float(np.linalg.norm(raw)) - 1) > 0.1
    np.testing.assert_allclose(raw / np.linalg.norm(raw), unset, rtol=1e-5, atol=1e-6)
    ours = zrpc.ZhembedStub(server.channel).Embed(zpb.EmbedRequest(inputs=[TEXTS[1]]))
    assert_same_vectors(f32(ours.vectors[0].values), unset)


def test_tei_embed_stream_answers_in_order(server: Server, stubs: dict[str, ModuleType]) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    texts = [f"第{i}句话" * (1 + i % 5) for i in range(40)]
    answers = list(
        rpc.EmbedStub(server.channel).EmbedStream(
            iter(pb.EmbedRequest(inputs=t, normalize=True) for t in texts)
        )
    )
    expected = post(server, "/embed", {"inputs": texts})
    assert len(answers) == len(texts)
    for got, want in zip(answers, expected, strict=True):  # batched otherwise: equal to float rounding
        assert_same_vectors(f32(got.embeddings), f32(want))


def test_tei_embed_all_tokenize_decode_and_info(server: Server, stubs: dict[str, ModuleType]) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    rows = rpc.EmbedStub(server.channel).EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[0]))
    want = post(server, "/embed_all", {"inputs": TEXTS[0]})[0]
    assert_same_vectors(f32([r.embeddings for r in rows.token_embeddings]), f32(want))
    tokens = rpc.TokenizeStub(server.channel).Tokenize(
        pb.EncodeRequest(inputs=TEXTS[1], add_special_tokens=True)
    )
    http_tokens = post(server, "/tokenize", {"inputs": TEXTS[1]})[0]
    assert [(t.id, t.text, t.special, t.start, t.stop) for t in tokens.tokens] == [
        (t["id"], t["text"], t["special"], t["start"], t["stop"]) for t in http_tokens
    ]
    decoded = rpc.TokenizeStub(server.channel).Decode(
        pb.DecodeRequest(ids=[t.id for t in tokens.tokens], skip_special_tokens=True)
    )
    assert decoded.text.replace(" ", "") == TEXTS[1]
    info = rpc.InfoStub(server.channel).Info(pb.InfoRequest())
    http_info = httpx.get(server.url + "/info").json()
    assert info.model_id == http_info["model_id"] and info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.max_input_length == http_info["max_input_length"] and info.model_dtype == "fp32"


def test_errors_carry_the_http_message_under_the_tables_status(
    server: Server, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc, zpb, zrpc = (
        stubs["tei_pb2"],
        stubs["tei_pb2_grpc"],
        stubs["zhembed_pb2"],
        stubs["zhembed_pb2_grpc"],
    )
    embed = rpc.EmbedStub(server.channel)
    empty = rpc_error(embed.Embed, pb.EmbedRequest(inputs="   "))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert empty.details() == post(server, "/embed", {"inputs": "   "}, 400)["error"]
    long = rpc_error(embed.Embed, pb.EmbedRequest(inputs="长城" * 100))
    assert long.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit of 128" in long.details()
    bad = rpc_error(
        zrpc.ZhembedStub(server.channel).Embed,
        zpb.EmbedRequest(inputs=["a"], options=zpb.EmbedOptions(pooling="median", layers=[9])),
    )
    http_bad = post(server, "/embed", {"inputs": ["a"], "pooling": "median", "layers": [9]}, 422)["error"]
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and bad.details() == http_bad
    kind = rpc_error(rpc.PredictStub(server.channel).Predict, pb.PredictRequest(inputs="a"))
    assert kind.code() == grpc.StatusCode.FAILED_PRECONDITION and "an embedding model" in kind.details()
    sparse = rpc_error(embed.EmbedSparse, pb.EmbedSparseRequest(inputs="a"))
    assert sparse.code() == grpc.StatusCode.FAILED_PRECONDITION and "SPLADE" in sparse.details()
    stream = rpc.EmbedStub(server.channel).EmbedStream(
        iter([pb.EmbedRequest(inputs="好"), pb.EmbedRequest(inputs="")])
    )
    first = next(stream)
    assert len(first.embeddings) == 64
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_zhembed_v1_says_what_tei_cannot(server: Server, stubs: dict[str, ModuleType]) -> None:
    zpb, zrpc = stubs["zhembed_pb2"], stubs["zhembed_pb2_grpc"]
    ours = zrpc.ZhembedStub(server.channel)
    options = zpb.EmbedOptions(
        pooling="cls", layers=[1, -1], layer_combine="weighted", layer_weights=[1.0, 3.0], long_text="chunk"
    )
    texts = [*TEXTS, "长城" * 100]
    got = ours.Embed(zpb.EmbedRequest(inputs=texts, options=options, normalize=False))
    body = {
        "inputs": texts,
        "pooling": "cls",
        "layers": [1, -1],
        "layer_combine": "weighted",
        "layer_weights": [1.0, 3.0],
        "long_text": "chunk",
        "normalize": False,
    }
    assert_same_vectors(f32([v.values for v in got.vectors]), f32(post(server, "/embed", body)))
    int8 = ours.Embed(zpb.EmbedRequest(inputs=TEXTS[:2], encoding=zpb.ENCODING_INT8))
    http_int8 = post(server, "/embed", {"inputs": TEXTS[:2], "encoding": "int8"})
    for v, h in zip(int8.vectors, http_int8, strict=True):
        # Batched apart, a component may round to the next int8 level: one level at most.
        assert np.abs(np.frombuffer(v.int8, dtype=np.int8).astype(int) - np.array(h["values"])).max() <= 1
        assert v.scale == pytest.approx(h["scale"], rel=BATCHING_TOLERANCE)
    for encoding, signed in ((zpb.ENCODING_UBINARY, False), (zpb.ENCODING_BINARY, True)):
        packed = ours.Embed(zpb.EmbedRequest(inputs=TEXTS[:2], encoding=encoding)).vectors
        rows = [np.frombuffer(v.packed, dtype=np.int8 if signed else np.uint8) for v in packed]
        assert all(len(v.values) == 0 and not v.int8 for v in packed)
        assert_same_bits(np.stack(rows), f32(post(server, "/embed", {"inputs": TEXTS[:2]})), signed)
    with pytest.raises(grpc.RpcError) as unknown:
        ours.Embed(zpb.EmbedRequest(inputs=TEXTS[:1], encoding=9))
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "encoding 9 is not one of zhembed.v1.Encoding's: 0 (float)" in (unknown.value.details() or "")
    scores = ours.Similarity(zpb.SimilarityRequest(source_sentence=TEXTS[0], sentences=TEXTS[1:]))
    http_scores = post(
        server, "/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    )
    np.testing.assert_allclose(scores.scores, http_scores, rtol=0, atol=2 * BATCHING_TOLERANCE)  # two vectors
    filled = ours.FillMask(
        zpb.FillMaskRequest(inputs=["北京是中国的[MASK]都。", "[MASK]天[MASK]气"], top_k=3)
    )
    http_filled = post(
        server, "/fill-mask", {"inputs": ["北京是中国的[MASK]都。", "[MASK]天[MASK]气"], "top_k": 3}
    )
    assert [c.token for c in filled.answers[0].masks[0].candidates] == [c["token"] for c in http_filled[0]]
    assert len(filled.answers[1].masks) == 2
    assert [c.token_str for c in filled.answers[1].masks[1].candidates] == [
        c["token_str"] for c in http_filled[1][1]
    ]


def test_health_reflection_and_metrics(server: Server, stubs: dict[str, ModuleType]) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(server.channel)
    for name in ("", "tei.v1.Embed", "zhembed.v1.Zhembed"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING, name
    reflection = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    (answer,) = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for s in answer.list_services_response.service}
    assert {"tei.v1.Embed", "tei.v1.Info", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize"} <= names
    assert {"zhembed.v1.Zhembed", "grpc.health.v1.Health"} <= names
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    rpc.EmbedStub(server.channel).Embed(pb.EmbedRequest(inputs="计数"))
    metrics = httpx.get(server.url + "/metrics").text
    assert (
        'zhembed_requests_total{protocol="grpc",route="/tei.v1.Embed/Embed",status="OK",urgency="3"}'
        in metrics
    )
    assert (
        'zhembed_requests_total{protocol="grpc",route="/tei.v1.Embed/Embed",status="INVALID_ARGUMENT",urgency="3"}'
        in metrics
    )
    assert 'protocol="http"' in metrics


def test_api_keys_and_overload(tiny_model_dir: Path, stubs: dict[str, ModuleType]) -> None:
    pb, rpc, zpb, zrpc = (
        stubs["tei_pb2"],
        stubs["tei_pb2_grpc"],
        stubs["zhembed_pb2"],
        stubs["zhembed_pb2_grpc"],
    )
    server = start_grpc_server(
        tiny_model_dir,
        ZHEMBED_API_KEYS=f"{KEY},bulk-key:u=7",
        ZHEMBED_MAX_CONCURRENT_INPUTS="4",
        ZHEMBED_MAX_INPUTS_PER_REQUEST="4",
    )
    try:
        embed = rpc.EmbedStub(server.channel)
        missing = rpc_error(embed.Embed, pb.EmbedRequest(inputs="你好"))
        assert (
            missing.code() == grpc.StatusCode.UNAUTHENTICATED and "Authorization: Bearer" in missing.details()
        )
        wrong = rpc_error(
            embed.Embed, pb.EmbedRequest(inputs="你好"), metadata=[("authorization", "Bearer nope")]
        )
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED and wrong.details() == "unknown API key"
        ok = embed.Embed(pb.EmbedRequest(inputs="你好"), metadata=[("authorization", f"Bearer {KEY}")])
        assert len(ok.embeddings) == 64
        # A stream's requests run at once: one that arrives while an earlier one holds every permit is
        # refused before any work, as HTTP's 429 is. Which one depends on when each arrives (three were
        # once all answered, each after the last had finished, on a loaded CI machine): 32 of them, sent
        # back to back, all but never each find the one before done.
        ours = zrpc.ZhembedStub(server.channel)
        stream = ours.EmbedStream(
            iter([zpb.EmbedRequest(inputs=["字" * 60] * 4)] * 32),
            metadata=[("authorization", f"Bearer {KEY}")],
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4 of 4 inputs in flight" in caught.value.details()
        assert ("retry-after", "1") in (caught.value.trailing_metadata() or ())
        # The stream's calls admitted before the refusal still run: the calls below wait until their
        # permits are back (a loaded machine once had them refused, "4 of 4 inputs in flight").
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {KEY}"}) as client:
            wait_until(lambda: metric(client, "zhembed_inputs_in_flight") == 0)
        # The metadata priority is read as HTTP's Priority header; the key's default where it sets none.
        for key, priority in [("bulk-key", None), ("bulk-key", "u=2"), (KEY, "u=5"), (KEY, "i, u=6")]:
            metadata = [("authorization", f"Bearer {key}")] + ([("priority", priority)] if priority else [])
            assert len(embed.Embed(pb.EmbedRequest(inputs="优先"), metadata=metadata).embeddings) == 64
        listed = list(
            ours.EmbedStream(
                iter([zpb.EmbedRequest(inputs=["流"])] * 2),
                metadata=[("authorization", f"Bearer {KEY}"), ("priority", "u=4")],
            )
        )
        assert len(listed) == 2
        metrics = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        for method, urgency in [
            ("Embed/Embed", 7),
            ("Embed/Embed", 2),
            ("Embed/Embed", 5),
            ("Embed/Embed", 6),
        ]:
            assert f'route="/tei.v1.{method}",status="OK",urgency="{urgency}"}} 1.0' in metrics, urgency
        assert 'route="/zhembed.v1.Zhembed/EmbedStream",status="OK",urgency="4"} 1.0' in metrics
    finally:
        stop_grpc_server(server)


def test_sigterm_drains_grpc_with_http(tiny_model_dir: Path, stubs: dict[str, ModuleType]) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    server = start_grpc_server(tiny_model_dir, ZHEMBED_SHUTDOWN_DRAIN_S="1.5", ZHEMBED_SHUTDOWN_GRACE_S="10")
    try:
        # A stream in flight across the signal: it was accepted, so it goes on to its last answer.
        release = threading.Event()

        def requests() -> Iterator[Any]:
            yield pb.EmbedRequest(inputs="信号之前")
            release.wait(10)
            for i in range(5):
                yield pb.EmbedRequest(inputs=f"信号之后{i}")

        answers: list[Any] = []

        def stream() -> None:
            for answer in rpc.EmbedStub(server.channel).EmbedStream(requests()):
                answers.append(answer)

        streaming = threading.Thread(target=stream)
        streaming.start()
        wait_until(lambda: len(answers) == 1)  # the stream is accepted and answering before the signal
        server.proc.send_signal(signal.SIGTERM)
        health = health_pb2_grpc.HealthStub(server.channel)
        wait_until(
            lambda: (
                health.Check(health_pb2.HealthCheckRequest()).status
                == health_pb2.HealthCheckResponse.NOT_SERVING
            )
        )
        refused = rpc_error(rpc.EmbedStub(server.channel).Embed, pb.EmbedRequest(inputs="新的"))
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert httpx.post(server.url + "/embed", json={"inputs": "新的"}).status_code == 503
        release.set()
        streaming.join(15)
        assert len(answers) == 6
        assert server.proc.wait(timeout=20) == 0
    finally:
        stop_grpc_server(server)


def test_every_worker_serves_grpc_behind_the_one_port(
    tiny_model_dir: Path, stubs: dict[str, ModuleType]
) -> None:
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    server = start_grpc_server(tiny_model_dir, ZHEMBED_WORKERS="2")
    try:
        for i in range(12):  # a connection each: the kernel spreads them over the workers' sockets
            with grpc.insecure_channel(
                server.target, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as channel:
                assert len(rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=f"第{i}句")).embeddings) == 64
        metrics = httpx.get(server.url + "/metrics").text  # one scrape adds up every worker
        assert (
            'zhembed_requests_total{protocol="grpc",route="/tei.v1.Embed/Embed",status="OK",urgency="3"} 12.0'
            in metrics
        )
    finally:
        stop_grpc_server(server)
