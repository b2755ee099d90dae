"""The live server the property suite generates requests against: ``python -m app`` in a process of its
own (the gRPC client's generated modules must not meet the server's in one descriptor pool), serving
HTTP and gRPC on three tiny models, so that every route and method reaches a model that can answer it:
the embedder with its MLM head and SPLADE graph (/embed, /embed_sparse, /fill-mask), a cross-encoder
(/rerank, /predict) and a tagger (/token-classification).

The limits are lowered so that generated requests reach them (a request over a limit must be a 4xx too).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.app.api.rpc.conftest import stubs  # noqa: F401  (the generated gRPC client)
from tests.app.api.rpc.grpc_process import Server, start_grpc_server, stop_grpc_server
from tests.app.conftest import wait_until

# Lowered from their defaults so that a generated request reaches them in a handful of examples.
LIMITS = {
    "ZHEMBED_MAX_INPUTS_PER_REQUEST": "16",
    "ZHEMBED_MAX_INPUT_CHARS": "1024",
    "ZHEMBED_MAX_EMBED_ALL_TOKENS": "512",
    "ZHEMBED_MAX_BODY_BYTES": str(64 * 1024),
}
# Every call's client timeout: generous (the tiny model answers any request within the limits in well
# under a second), so a call past it is a stall, not a slow machine.
CALL_TIMEOUT_S = 10.0
# CI's run is bounded by examples, not time: a few per operation, the same ones each run (reproducible).
# A deeper search for a local run: PROPERTY_EXAMPLES=200 (more examples, random ones).
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "10"))
DEEP = EXAMPLES > 10

# A server fault or a stall; every other code is an answer (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND…).
FAULTS = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE,
}
# Sixteen texts (the live limit per request) of 14 to 130 tokens: a heavy request's inputs.
TEXTS = [f"第{i}句：北京是中国的首都，" + "长城" * (i * 7 % 60) for i in range(16)]


# The live server's models, by the names requests give them.
SERVED = ("embed", "rerank", "ner")


@pytest.fixture(scope="session")
def live(tiny_sparse_dir: Path, tiny_reranker_dir: Path, tiny_tagger_dir: Path) -> Iterator[Server]:
    folders = (tiny_sparse_dir, tiny_reranker_dir, tiny_tagger_dir)
    models = ",".join(f"{name}={folder}" for name, folder in zip(SERVED, folders, strict=True))
    running = start_grpc_server(
        tiny_sparse_dir, ZHEMBED_MODELS=models, ZHEMBED_SHUTDOWN_DRAIN_S="0.2", **LIMITS
    )
    yield running
    stop_grpc_server(running)


def in_flight(server: Server) -> float:
    """Inputs holding admission permits, over every model (``zhembed_inputs_in_flight``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=CALL_TIMEOUT_S).text
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "zhembed_inputs_in_flight"
    ]
    assert found, "no zhembed_inputs_in_flight on /metrics"
    return sum(found)


def assert_healthy(server: Server) -> None:
    """The server answers /health 200 and every permit has come back."""
    assert server.proc.poll() is None, f"the server exited: {server.output()}"
    health = httpx.get(server.url + "/health", timeout=CALL_TIMEOUT_S)
    assert health.status_code == 200, health.text
    wait_until(lambda: in_flight(server) == 0, seconds=CALL_TIMEOUT_S)


@pytest.fixture(autouse=True)
def healthy_after(live: Server) -> Iterator[None]:
    """After each test (an operation's or a method's examples), the server is healthy and idle again."""
    yield
    assert_healthy(live)
