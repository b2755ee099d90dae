"""app/engine/clock.py's thread CPU reading: this thread's CPU, as ``time.thread_time`` counts it, and no
other thread's."""

from __future__ import annotations

import threading
import time

import pytest

from app.engine import clock
from app.engine.clock import thread_cpu_seconds


def burn(seconds: float) -> float:
    """Spin this thread until ``time.thread_time`` has counted ``seconds`` of its CPU; what it counted."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        sum(range(1000))
    return time.thread_time() - start


def test_it_counts_this_threads_cpu_as_thread_time_does() -> None:
    before = thread_cpu_seconds()
    spent = burn(0.2)
    counted = thread_cpu_seconds() - before
    # getrusage's count is as of the thread's last tick or switch: a few ms behind at most.
    assert counted == pytest.approx(spent, abs=0.02)


def test_another_threads_cpu_is_not_counted() -> None:
    before = thread_cpu_seconds()
    other = threading.Thread(target=burn, args=(0.2,))
    other.start()
    other.join()  # waiting uses no CPU of this thread
    assert thread_cpu_seconds() - before < 0.05


def test_without_rusage_thread_it_is_thread_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_THREAD", None)
    monkeypatch.setattr(time, "thread_time", lambda: 12.5)
    assert thread_cpu_seconds() == 12.5
