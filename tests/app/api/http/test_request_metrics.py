"""A request is counted once, by route, status and the urgency it was served at; its failure by reason."""

from __future__ import annotations

import contextvars
import time

from app.api.errors import SCOPE_ERROR_TYPE
from app.api.http.request_metrics import count
from app.engine.priority import URGENCY
from app.telemetry.metrics import Metrics


def test_a_request_is_counted_once_at_its_urgency_with_its_failure() -> None:
    metrics = Metrics()

    def served_at_six() -> None:
        URGENCY.set(6)
        count(metrics, None, "/embed", 429, time.perf_counter(), {SCOPE_ERROR_TYPE: "overloaded"}, None)

    contextvars.copy_context().run(served_at_six)
    count(metrics, None, "/embed", 200, time.perf_counter(), {}, None)
    assert metrics.requests.labels("/embed", "429", "http", "6")._value.get() == 1
    assert metrics.requests.labels("/embed", "200", "http", "3")._value.get() == 1
    assert metrics.request_duration.labels("/embed", "http", "6")._sum.get() >= 0
    assert metrics.failures.labels("overloaded")._value.get() == 1
    assert metrics.failures.labels("internal")._value.get() == 0
