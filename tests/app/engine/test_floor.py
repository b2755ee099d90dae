"""Background's floor as an account (Floor, app/engine/batching.py): owed its share of each batch's cost,
paid in the worth of the background inputs served, bounded both ways, and nothing once nothing waits."""

import pytest

from app.engine.batching import Floor


def test_background_is_owed_its_share_of_each_batch_less_what_it_got() -> None:
    floor = Floor(0.1)
    assert not floor.due()
    floor.account(cost=1.0, worth=0.0, bound=10.0)
    assert floor.owed == pytest.approx(0.1) and floor.due()
    floor.account(cost=0.5, worth=0.4, bound=10.0)  # a floor batch pays more than its own share
    assert floor.owed == pytest.approx(0.1 + 0.05 - 0.4) and not floor.due()


def test_what_is_owed_is_bounded_both_ways_and_cleared() -> None:
    floor = Floor(0.1)
    for _ in range(100):
        floor.account(cost=1.0, worth=0.0, bound=2.0)
    assert floor.owed == 2.0  # a long wait does not owe a burst
    floor.account(cost=1.0, worth=50.0, bound=2.0)
    assert floor.owed == -2.0  # riding along a lot does not silence it for long
    floor.clear()
    assert floor.owed == 0.0


def test_a_share_of_zero_is_never_due() -> None:
    floor = Floor(0.0)
    floor.account(cost=1.0, worth=-1.0, bound=2.0)
    assert not floor.due()
