"""The bounds a served gRPC call meets (app/api/rpc/server.py, limits.py, calls.py), over the wire against
``python -m app`` whose model runs wait on a gate (gated_app.py): calls beyond
``grpc_max_concurrent_rpcs`` are refused, Tokenize and Decode take permits, and RerankStream is refused at
its request limit while the client is still sending.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import pytest

from tests.app.api.rpc.grpc_process import Server, rpc_error, start_grpc_server, stop_grpc_server
from tests.app.conftest import metric, wait_until

LIMIT = 4  # max_concurrent_inputs and max_inputs_per_request
RPCS = 3  # grpc_max_concurrent_rpcs


@pytest.fixture(scope="module")
def gated(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """The server, and the file whose existence lets its model runs go (absent: they wait); open while it
    starts (its cost model's calibration runs the model)."""
    gate = tmp_path_factory.mktemp("gate") / "open"
    gate.touch()
    server = start_grpc_server(
        tiny_model_dir,
        module="tests.app.api.rpc.gated_app",
        ZHEMBED_TEST_GATE=str(gate),
        ZHEMBED_WARMUP="false",
        ZHEMBED_MAX_CONCURRENT_INPUTS=str(LIMIT),
        ZHEMBED_MAX_INPUTS_PER_REQUEST=str(LIMIT),
        ZHEMBED_GRPC_MAX_CONCURRENT_RPCS=str(RPCS),
    )
    gate.unlink()
    yield server, gate
    gate.touch()
    stop_grpc_server(server)


def test_tokenize_decode_and_decode_stream_are_refused_when_the_budget_is_full(
    gated: tuple[Server, Path], stubs: dict[str, ModuleType]
) -> None:
    server, gate = gated
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    tokenize = rpc.TokenizeStub(server.channel)
    with httpx.Client(base_url=server.url, timeout=120) as client, ThreadPoolExecutor(1) as pool:
        held = pool.submit(client.post, "/embed", json={"inputs": [f"占满 {i}" for i in range(LIMIT)]})
        try:
            wait_until(lambda: metric(client, "zhembed_inputs_in_flight") == LIMIT)
            refusals = [
                rpc_error(tokenize.Tokenize, pb.EncodeRequest(inputs="北京")),
                rpc_error(tokenize.Decode, pb.DecodeRequest(ids=[101, 102])),
                rpc_error(lambda: list(tokenize.DecodeStream(iter([pb.DecodeRequest(ids=[101])])))),
            ]
            for refused in refusals:
                assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
                assert f"{LIMIT} of {LIMIT} inputs in flight" in refused.details()
        finally:
            gate.touch()
        assert held.result(timeout=120).status_code == 200
        gate.unlink()
        wait_until(lambda: metric(client, "zhembed_inputs_in_flight") == 0)
    assert tokenize.Decode(pb.DecodeRequest(ids=[101, 102])).text  # the permits came back


def test_the_call_over_the_concurrent_rpc_bound_is_refused(
    gated: tuple[Server, Path], stubs: dict[str, ModuleType]
) -> None:
    server, _gate = gated
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    tokenize = rpc.TokenizeStub(server.channel)
    release = threading.Event()

    def requests() -> Iterator[Any]:
        yield pb.DecodeRequest(ids=[101])
        release.wait(timeout=120)  # the stream stays open until the test has made its point

    streams = [tokenize.DecodeStream(requests()) for _ in range(RPCS)]
    try:
        for stream in streams:
            assert next(stream).text  # each stream is being served
        over = rpc_error(tokenize.Decode, pb.DecodeRequest(ids=[101]))
        assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, over.details()
    finally:
        release.set()
    for stream in streams:
        assert list(stream) == []  # each ended with its client's stream
    assert tokenize.Decode(pb.DecodeRequest(ids=[101])).text  # room again once they ended


def test_rerank_stream_is_refused_at_the_limit_while_the_client_still_sends(
    gated: tuple[Server, Path], stubs: dict[str, ModuleType]
) -> None:
    # The client sends one text over the limit and then keeps its stream open: reading the whole stream
    # before any limit would wait for its end (until the deadline); the refusal comes without it.
    server, _gate = gated
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    done = threading.Event()

    def requests() -> Iterator[Any]:
        for i in range(LIMIT + 1):
            yield pb.RerankStreamRequest(query="问题", text=f"第{i}段")
        done.wait(timeout=120)

    try:
        refused = rpc_error(rpc.RerankStub(server.channel).RerankStream, requests(), timeout=60)
    finally:
        done.set()
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    assert f"more than {LIMIT} texts in one stream; the limit is {LIMIT}" in refused.details()
