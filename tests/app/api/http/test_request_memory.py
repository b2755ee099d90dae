"""Nothing of a request outlives it: its job (and with it the result arrays) is freed by reference counting
when the answer is sent, on every route that runs the encoder, not left to the rare full collection of
Python's cycle collector (docs/performance.md, "python -m loadtest.memory")."""

from __future__ import annotations

import gc
from typing import Any

import httpx
import pytest

from app.engine.work import Job

REQUESTS = 30
# A job or two may still be referenced after the last answer (the stage threads' last item).
LINGERING = 3

ROUTES: list[tuple[str, Any]] = [
    ("/embed", lambda i: {"inputs": [f"{i} 今天天气很好", f"{i} 我们去公园"]}),
    ("/v1/embeddings", lambda i: {"input": f"{i} 今天天气很好", "model": "m"}),
    ("/embed_all", lambda i: {"inputs": f"{i} 今天天气很好"}),
    ("/similarity", lambda i: {"inputs": {"source_sentence": f"{i} 天气", "sentences": ["好", "坏"]}}),
    ("/fill-mask", lambda i: {"inputs": f"{i} 今天天气很[MASK]"}),
]


# Refused once the engine has the request (too long, found while its job is planned): the exception's
# traceback holds frames that hold the job, so a job that kept the exception would be a cycle.
REFUSED: list[tuple[str, Any]] = [
    ("/embed", lambda i: {"inputs": [f"{i} " + "好" * 3000], "truncate": False}),
    ("/embed_all", lambda i: {"inputs": f"{i} " + "好" * 3000, "truncate": False}),
]


def jobs_alive() -> int:
    return sum(isinstance(o, Job) for o in gc.get_objects())


# Each route's requests, answered (200) and refused (422).
CASES = [(r, b, 200) for r, b in ROUTES] + [(r, b, 422) for r, b in REFUSED]


@pytest.mark.parametrize(("route", "body", "status"), CASES, ids=[f"{r} {status}" for r, _, status in CASES])
def test_no_job_outlives_its_request(client: httpx.Client, route: str, body: Any, status: int) -> None:
    gc.collect()
    gc.disable()  # only reference counting frees anything now
    try:
        before = jobs_alive()
        for i in range(REQUESTS):
            response = client.post(route, json=body(i))
            assert response.status_code == status, response.text
        after = jobs_alive()
    finally:
        gc.enable()
    assert after - before <= LINGERING
