"""Clients that leave: generated mixes of the heaviest requests the live server's limits allow, sent at
once, some by clients that give up after a few milliseconds. Those that stay get no 5xx within the timeout,
and once all are done the server is healthy with every admission permit back: a permit lives as long as
its work, whoever left."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.api.rpc.grpc_process import Server
from tests.app.property.conftest import CALL_TIMEOUT_S, DEEP, EXAMPLES, TEXTS, assert_healthy

pytestmark = pytest.mark.property

# The heaviest request of each route the live server's limits allow (tests/app/property/conftest.py).
HEAVY: list[tuple[str, dict[str, Any]]] = [
    ("/embed", {"inputs": TEXTS, "long_text": "chunk"}),
    ("/embed_sparse", {"inputs": TEXTS, "truncate": True}),
    ("/embed_all", {"inputs": TEXTS[:4], "truncate": True}),
    ("/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}),
    ("/fill-mask", {"inputs": "北京是中国的首都" + "[MASK]" * 100, "top_k": 50}),
    ("/tokenize", {"inputs": ["长城" * 500] * 16}),
    ("/rerank", {"query": TEXTS[0], "texts": TEXTS, "truncate": True, "return_text": True}),
    ("/predict", {"inputs": [[t, t] for t in TEXTS], "truncate": True}),
    ("/token-classification", {"inputs": TEXTS, "truncate": True}),
    ("/v1/embeddings", {"input": TEXTS, "model": "embed"}),
]
# A client's patience: a few milliseconds (it leaves while its work is queued or running), or the whole.
PATIENCE = st.sampled_from([0.002, 0.01, 0.05, CALL_TIMEOUT_S])


def send(url: str, route: str, body: dict[str, Any], patience: float) -> int | None:
    """The status of one POST, or None when the client left first."""
    try:
        return httpx.post(url + route, json=body, timeout=patience).status_code
    except httpx.TimeoutException:
        if patience == CALL_TIMEOUT_S:
            raise AssertionError(f"{route} stalled past the {CALL_TIMEOUT_S} s client timeout") from None
        return None


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not DEEP, suppress_health_check=list(HealthCheck))
@given(requests=st.lists(st.tuples(st.sampled_from(HEAVY), PATIENCE), min_size=1, max_size=24))
def test_clients_that_leave_cost_no_5xx_and_no_permit(
    requests: list[tuple[tuple[str, dict[str, Any]], float]], live: Server
) -> None:
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = [pool.submit(send, live.url, route, body, patience) for (route, body), patience in requests]
        statuses = [
            (route, answer.result()) for ((route, _), _), answer in zip(requests, answers, strict=True)
        ]
    # Each request is within the limits: answered, or refused for overload (the budget is ~170 inputs a
    # model, and 24 requests of 16 inputs overrun it).
    unexpected = [(route, status) for route, status in statuses if status not in (None, 200, 429)]
    assert not unexpected, unexpected
    assert_healthy(live)
