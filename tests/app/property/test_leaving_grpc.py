"""Clients that leave, over gRPC: generated mixes of heavy calls (streams of many messages included),
sent at once, some with a deadline of a few milliseconds. Calls with the whole timeout end in no server
fault and no stall, and after each mix the server is healthy with every admission permit back."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.api.rpc.grpc_process import Server
from tests.app.property.conftest import (
    CALL_TIMEOUT_S,
    DEEP,
    EXAMPLES,
    FAULTS,
    LIMITS,
    TEXTS,
    assert_healthy,
)

pytestmark = pytest.mark.property

# Each heavy call as (its name, a function of the stubs and the channel that makes it with a timeout).
Call = Callable[[dict[str, ModuleType], grpc.Channel, float], Any]


def _embed_stream(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    pb = s["tei_pb2"]
    stream = (pb.EmbedRequest(inputs=t, truncate=True) for t in TEXTS * 4)
    return list(s["tei_pb2_grpc"].EmbedStub(channel).EmbedStream(stream, timeout=timeout))


def _rerank_stream(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    pb = s["tei_pb2"]
    stream = (pb.RerankStreamRequest(query=TEXTS[0], text=t, truncate=True) for t in TEXTS)
    return s["tei_pb2_grpc"].RerankStub(channel).RerankStream(stream, timeout=timeout)


def _tokenize_stream(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    stream = (s["tei_pb2"].EncodeRequest(inputs="长城" * 500) for _ in range(16))
    return list(s["tei_pb2_grpc"].TokenizeStub(channel).TokenizeStream(stream, timeout=timeout))


def _decode_stream(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    # The most ids one Decode takes: the tokens of the longest input allowed, with its [CLS] and [SEP].
    most = int(LIMITS["ZHEMBED_MAX_INPUT_CHARS"]) + 2
    stream = (s["tei_pb2"].DecodeRequest(ids=list(range(100, 100 + most))) for _ in range(16))
    return list(s["tei_pb2_grpc"].TokenizeStub(channel).DecodeStream(stream, timeout=timeout))


def _fill_mask(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    request = s["zhembed_pb2"].FillMaskRequest(inputs=["北京是中国的首都" + "[MASK]" * 100], top_k=50)
    return s["zhembed_pb2_grpc"].ZhembedStub(channel).FillMask(request, timeout=timeout)


def _embed(s: dict[str, ModuleType], channel: grpc.Channel, timeout: float) -> Any:
    options = s["zhembed_pb2"].EmbedOptions(long_text="chunk", layers=[1, 2, 3])
    request = s["zhembed_pb2"].EmbedRequest(inputs=TEXTS, options=options)
    return s["zhembed_pb2_grpc"].ZhembedStub(channel).Embed(request, timeout=timeout)


HEAVY: list[tuple[str, Call]] = [
    ("EmbedStream", _embed_stream),
    ("RerankStream", _rerank_stream),
    ("TokenizeStream", _tokenize_stream),
    ("DecodeStream", _decode_stream),
    ("FillMask", _fill_mask),
    ("Embed", _embed),
]
PATIENCE = st.sampled_from([0.002, 0.01, 0.05, CALL_TIMEOUT_S])


def send(stubs: dict[str, ModuleType], channel: grpc.Channel, call: Call, patience: float) -> str:
    """The call's status code's name."""
    try:
        call(stubs, channel, patience)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and patience < CALL_TIMEOUT_S:
            return "LEFT"
        return f"{code.name}: {exc.details()}" if code in FAULTS else code.name
    return "OK"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not DEEP, suppress_health_check=list(HealthCheck))
@given(calls=st.lists(st.tuples(st.sampled_from(HEAVY), PATIENCE), min_size=1, max_size=16))
def test_grpc_clients_that_leave_cost_no_fault_and_no_permit(
    calls: list[tuple[tuple[str, Call], float]], live: Server, stubs: dict[str, ModuleType]
) -> None:
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = [pool.submit(send, stubs, live.channel, call, patience) for (_, call), patience in calls]
        codes = [(name, answer.result()) for ((name, _), _), answer in zip(calls, answers, strict=True)]
    # Each call is within the limits: answered, refused for overload, or left by its client.
    unexpected = [(name, code) for name, code in codes if code not in ("OK", "RESOURCE_EXHAUSTED", "LEFT")]
    assert not unexpected, unexpected
    assert_healthy(live)
