"""loadtest.soak.faults: the schedule, the slots, every request's fate."""

from __future__ import annotations

import pytest

from loadtest.soak import faults
from loadtest.soak.faults import (
    FaultEvent,
    FaultSpecError,
    PidSlots,
    SentRequest,
    fate_of,
    fate_table,
    parse_faults,
)


def test_the_fault_schedule_in_seconds_minutes_or_a_share_with_the_sigterm_last() -> None:
    parsed = parse_faults("redis@20m, kill@90s,bound", 3600.0, bound=True)
    assert [(f.kind, f.at_s) for f in parsed] == [
        ("kill", 90.0),
        ("redis", 1200.0),
        ("bound", None),
        ("term", None),
    ]
    assert [(f.kind, f.at_s) for f in parse_faults("default", 400.0, bound=False)] == [
        ("kill", 100.0),
        ("redis", 200.0),
        ("term", None),
    ]
    assert [f.kind for f in parse_faults("default", 400.0, bound=True)] == ["kill", "redis", "bound", "term"]
    assert parse_faults("", 60.0, bound=False) == parse_faults("none", 60.0, bound=False) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kill@2h", "NUMBER then s, m or %"),
        ("kill@70s", "outside the soak"),
        ("kill@100%", "outside the soak"),
        ("crash@1m", "unknown fault"),
        ("bound", "needs --worker-max-memory-mb"),
        ("term@30s", "takes no time"),
    ],
)
def test_a_fault_schedule_that_cannot_run_is_refused(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec, 60.0, bound=False)


def test_slots_follow_a_killed_worker_and_a_replacement_that_starts_first() -> None:
    slots = PidSlots([20, 10])
    assert (slots.slot(10), slots.slot(20)) == (0, 1)
    # kill -9: the old one gone and its replacement there in the same reading
    assert slots.update([20, 30], 5.0) == [("gone", 10, 0, 5.0), ("new", 30, 0, 5.0)]
    # the memory bound: the replacement first, while every slot is full; the old one stops later
    assert slots.update([20, 30, 40], 8.0) == [("waiting", 40, None, 8.0)]
    assert slots.slot(40) is None and slots.slot(20) == 1
    assert slots.update([30, 40], 11.0) == [("gone", 20, 1, 11.0), ("new", 40, 1, 8.0)]
    assert slots.slot(40) == 1 and slots.update([30, 40], 12.0) == []


def test_a_request_fate_from_its_answer_or_its_error() -> None:
    assert fate_of(200, None, True, False) == "200"
    assert fate_of(200, None, True, True) == "200 + retried"
    assert fate_of(503, None, True, False) == "HTTP 503"
    assert fate_of(None, ConnectionResetError(), False, False) == "lost: no answer"
    assert fate_of(None, EOFError(), True, True) == "lost: answer cut + retried"
    assert fate_of(None, ConnectionRefusedError(), False, False) == "refused: no connection"
    assert fate_of(None, TimeoutError(), False, False) == "error: TimeoutError"


def test_the_fate_table_allows_losses_only_on_the_killed_worker_and_503_only_at_the_sigterm() -> None:
    events = [
        FaultEvent(faults.KILL, 10.0, 12.0, "kill", on_killed=[1, 2]),
        FaultEvent(faults.REDIS, 20.0, 25.0, "redis"),
        FaultEvent(faults.TERM, 40.0, 42.0, "term"),
    ]
    requests = [
        SentRequest(0, 1.0, 1.1, "200"),
        SentRequest(1, 9.9, 10.0, "lost: no answer"),  # in flight on the killed worker
        SentRequest(2, 9.8, 10.5, "200 + retried"),
        SentRequest(3, 10.2, 10.3, "200"),  # in the kill's window
        SentRequest(4, 13.5, 13.6, "200"),  # within the settle time after it
        SentRequest(5, 15.0, 15.1, "200"),  # after it
        SentRequest(6, 19.0, 20.5, "lost: no answer"),  # in flight when Redis stopped: a loss
        SentRequest(7, 39.9, 40.2, "HTTP 503"),  # in flight at the SIGTERM, refused by the drain
        SentRequest(8, 39.8, 40.1, "200"),
    ]
    table = fate_table(requests, events, settle_s=2.0)
    assert table == {
        faults.NONE: {"200": 2},
        faults.ON_KILLED: {"200 + retried": 1, "lost: no answer": 1},
        faults.KILL: {"200": 2},
        faults.REDIS: {"lost: no answer": 1},
        faults.IN_FLIGHT_AT_TERM: {"200": 1, "HTTP 503": 1},
    }
    assert faults.losses(table) == {faults.REDIS: 1}
    text = faults.render_table(table)
    assert text.splitlines()[0].split()[:3] == ["fault", "200", "200"]  # the answered fates first
    assert len(text.splitlines()) == 1 + len(table)
