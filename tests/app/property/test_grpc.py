"""Generated messages for every method of both gRPC services (text-embeddings-inference's ``tei.v1``
and ``zhembed.v1``), unary and streaming, against the live server: no call ends INTERNAL or UNKNOWN (a
server fault), none outlasts the client's timeout (a stall), and the server is healthy after each method
(tests/app/property/conftest.py)."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.api.rpc.conftest import PROTOS
from tests.app.api.rpc.grpc_process import Server
from tests.app.property.conftest import CALL_TIMEOUT_S, DEEP, EXAMPLES, FAULTS
from tests.app.property.messages import message

pytestmark = pytest.mark.property


# Each method of each service, read from the .proto files (the descriptors come from a fixture, too late to
# parametrize by; test_every_method_is_listed checks this list against them).
SERVICE = re.compile(r"^service (\w+) \{(.*?)^\}", re.S | re.M)
RPC = re.compile(r"rpc (\w+) \(")
METHODS = [
    (module, service, method)
    for module in ("tei", "zhembed")
    for service, body in SERVICE.findall((PROTOS / f"{module}.proto").read_text())
    for method in RPC.findall(body)
]
# The metadata `model`: none (the method's default), each served model, one that is not served.
MODELS = st.sampled_from([None, None, "embed", "rerank", "ner", "nonexistent"])


def test_every_method_is_listed(stubs: dict[str, ModuleType]) -> None:
    described = {
        (module, service.name, method.name)
        for module in ("tei", "zhembed")
        for service in stubs[f"{module}_pb2"].DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(METHODS) == described


def call(channel: grpc.Channel, pb: ModuleType, method: Any, requests: list[Any], model: str | None) -> None:
    """Send ``requests`` (one for a unary request) to ``method`` and read every answer."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    answer = getattr(pb, method.output_type.name).FromString
    kwargs: dict[str, Any] = {
        "timeout": CALL_TIMEOUT_S,
        "metadata": [("model", model)] if model is not None else None,
    }
    serialize = getattr(pb, method.input_type.name).SerializeToString
    if method.client_streaming and method.server_streaming:
        list(channel.stream_stream(path, serialize, answer)(iter(requests), **kwargs))
    elif method.client_streaming:
        channel.stream_unary(path, serialize, answer)(iter(requests), **kwargs)
    elif method.server_streaming:
        list(channel.unary_stream(path, serialize, answer)(requests[0], **kwargs))
    else:
        channel.unary_unary(path, serialize, answer)(requests[0], **kwargs)


@pytest.mark.parametrize(("module", "service", "method"), METHODS, ids=[f"{s}/{m}" for _, s, m in METHODS])
def test_no_message_gets_a_server_fault_or_stalls(
    module: str, service: str, method: str, live: Server, stubs: dict[str, ModuleType]
) -> None:
    pb = stubs[f"{module}_pb2"]
    described = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    one = message(pb, described.input_type)
    requests = st.lists(one, max_size=5) if described.client_streaming else st.tuples(one).map(list)
    answered: list[str] = []  # "OK", or each refusal's code and message

    @settings(
        max_examples=3 * EXAMPLES,  # a call costs little: most are refused before the model
        deadline=None,
        derandomize=not DEEP,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(requests=requests, model=MODELS)
    def examples(requests: list[Any], model: str | None) -> None:
        try:
            call(live.channel, pb, described, requests, model)
        except grpc.RpcError as exc:
            assert exc.code() not in FAULTS, f"{exc.code()}: {exc.details()}"
            answered.append(f"{exc.code().name}: {exc.details()}")
        else:
            answered.append("OK")

    examples()
    # Not only refusals: some of the generated messages reached a model and were answered.
    assert "OK" in answered, (
        f"none of {len(answered)} generated messages was answered: {sorted(set(answered))}"
    )
