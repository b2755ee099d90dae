"""Admission: permits per input, all or none, 429 when full, released once."""

from __future__ import annotations

import pytest

from app.engine.admission import HELD, Admission
from app.errors import Overloaded


def test_permits_are_taken_all_or_none_and_released() -> None:
    admission = Admission(limit=5)
    with admission.try_acquire(3):
        assert admission.in_use == 3
        with pytest.raises(Overloaded):
            admission.try_acquire(3)
        assert admission.in_use == 3 and admission.rejected == 1
        permits = admission.try_acquire(2)
        permits.release()
        permits.release()  # idempotent
    assert admission.in_use == 0


def test_a_request_takes_at_least_one_permit() -> None:
    with pytest.raises(ValueError):
        Admission(limit=5).try_acquire(0)


def test_background_requests_are_refused_before_interactive_ones_from_one_budget() -> None:
    admission = Admission(limit=8)
    background = admission.try_acquire(4, urgency=7)  # u=7 may fill half of it
    with pytest.raises(Overloaded, match="of which requests of urgency 7 may fill 4"):
        admission.try_acquire(1, urgency=7)
    interactive = admission.try_acquire(4)  # the default urgency: the whole budget
    assert admission.in_use == 8
    with pytest.raises(Overloaded, match="8 of 8 inputs in flight;"):
        admission.try_acquire(1, urgency=0)  # one budget: more urgent work cannot pass its end either
    background.release()
    interactive.release()
    assert admission.in_use == 0 and admission.rejected == 2


def test_joining_another_ledger_counts_there_and_refuses_with_permits_held() -> None:
    from app.engine.admission import LocalLedger

    admission, server = Admission(limit=4), LocalLedger()
    held = admission.try_acquire(1)
    with pytest.raises(RuntimeError, match="1 permits held"):
        admission.join(server)
    held.release()
    admission.join(server)
    with admission.try_acquire(3):
        assert server.total() == 3
    assert server.total() == 0


def test_permits_a_stage_keeps_are_given_back_when_the_last_holder_lets_go() -> None:
    admission = Admission(limit=4)
    with admission.try_acquire(3) as permits:
        assert HELD.get() is permits  # for the stages to find, in the request's task
        permits.keep()  # a queue holds some of its work
    assert HELD.get() is None
    assert admission.in_use == 3  # the request is done, its work is still queued
    with pytest.raises(Overloaded):
        admission.try_acquire(2)
    permits.release()  # idempotent: the request's own hold is let go once
    assert admission.in_use == 3
    permits.let_go()  # the work left its queue
    assert admission.in_use == 0
    with pytest.raises(RuntimeError, match="already given back"):
        permits.keep()
