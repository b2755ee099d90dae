"""The supervisor's decisions (:class:`app.serving.slots.Slots`), with fake processes, memory and clock:
which worker is replaced, when, and in what order."""

from __future__ import annotations

import multiprocessing as mp
import signal

from app.serving.cluster import Cluster, Shared
from app.serving.slots import EARLY_DEATHS, MB, MEMORY_CHECK_S, MIN_UPTIME_S, RETIRE_SIGNAL, Slots


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid: int | None = pid
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.exitcode is None


class Fakes:
    """Two workers bounded to 100 MB, one spare slot; every process, reading and signal is recorded."""

    def __init__(self, count: int = 2, bound_mb: int = 100) -> None:
        self.now = 1000.0
        self.started: list[tuple[int, str | None, FakeProc]] = []
        self.memory_mb: dict[int, float] = {}
        self.killed: list[tuple[int, int]] = []
        self.shared = Shared.create(mp.get_context("spawn"), count + 1, count, "/nonexistent")
        self.slots = Slots(
            count,
            self.shared,
            self.start,
            bound_bytes=bound_mb * MB,
            retire_s=5.0,
            memory=lambda pid: int(self.memory_mb[pid] * MB) if pid in self.memory_mb else None,
            kill=lambda pid, sig: self.killed.append((pid, sig)),
            clock=lambda: self.now,
        )

    def start(self, index: int, replacing: str | None) -> FakeProc:
        proc = FakeProc(100 + len(self.started))
        self.started.append((index, replacing, proc))
        return proc

    def proc(self, index: int) -> FakeProc:
        slot = self.slots.slots[index]
        assert slot is not None
        return slot.proc  # type: ignore[return-value]

    def step(self, seconds: float = MEMORY_CHECK_S) -> None:
        self.now += seconds
        assert self.slots.step()

    def serving(self) -> list[int]:
        return list(self.shared.serving[:])


def test_a_worker_past_the_bound_is_replaced_first_and_retired_once_the_replacement_is_ready() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    old = f.proc(0)
    f.memory_mb = {old.pid: 150, f.proc(1).pid: 80}  # type: ignore[dict-item]
    f.step()
    assert [(i, why) for i, why, _ in f.started[2:]] == [(2, "memory")]  # in the spare slot
    assert f.killed == [] and f.serving() == [1, 1, 0]  # the old one still serves, the new one not yet
    assert Cluster(f.shared, 0).all_ready()  # its not-yet-ready slot does not make /ready false
    for _ in range(5):  # still starting: nothing more happens, and nothing starts twice
        f.step()
    assert len(f.started) == 3 and f.killed == []
    f.shared.ready[2] = 1
    f.step(0.1)
    assert f.killed == [(old.pid, RETIRE_SIGNAL)]
    assert f.serving() == [0, 1, 1] and Cluster(f.shared, 1).all_ready()
    for _ in range(3):  # retiring, and still past the bound: not retired again, nothing new started
        f.step()
    assert f.killed == [(old.pid, RETIRE_SIGNAL)] and len(f.started) == 3
    old.exitcode = 0
    f.step(0.1)
    assert f.slots.slots[0] is None and f.shared.ready[0] == 0  # forgotten: the spare slot now


def test_one_replacement_at_a_time() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150, f.proc(1).pid: 150}  # type: ignore[dict-item]
    f.step()
    assert [i for i, _, _ in f.started[2:]] == [2]  # the second waits: the pod holds one worker more
    f.shared.ready[2] = 1
    f.step()
    f.memory_mb[f.proc(2).pid] = 50  # type: ignore[index]
    f.step()
    assert len(f.started) == 3  # no free slot until the retiring worker has exited
    f.proc(0).exitcode = 0
    f.step()
    f.step()
    assert [(i, why) for i, why, _ in f.started[3:]] == [(0, "memory")]  # now the second, in the freed slot


def test_no_bound_no_replacement_and_memory_is_published() -> None:
    f = Fakes(bound_mb=0)
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 5000, f.proc(1).pid: 60}  # type: ignore[dict-item]
    f.step()
    assert len(f.started) == 2 and f.killed == []
    assert list(f.shared.memory[:2]) == [5000 * MB, 60 * MB]


def test_a_worker_not_yet_ready_is_not_replaced_for_its_memory() -> None:
    f = Fakes()
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]  # e.g. a peak while loading
    f.step()
    assert len(f.started) == 2


def test_a_replacement_that_dies_while_starting_is_started_again_or_stops_the_server() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]
    f.step()
    f.step(MIN_UPTIME_S)
    f.proc(2).exitcode = 1  # past its start-up window: started again, still to replace worker 0
    f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(2, "memory"), (2, "memory")]
    f.shared.ready[2] = 1
    f.step(0.1)
    assert f.killed == [(f.proc(0).pid, RETIRE_SIGNAL)]

    g = Fakes()
    g.shared.ready[0] = g.shared.ready[1] = 1
    g.memory_mb = {g.proc(0).pid: 150}  # type: ignore[dict-item]
    g.step()
    for _ in range(EARLY_DEATHS - 1):  # right after its start: started again, a few times
        g.proc(2).exitcode = 1
        g.step(0.1)
    assert [(i, why) for i, why, _ in g.started[2:]] == [(2, "memory")] * EARLY_DEATHS
    g.proc(2).exitcode = 1  # and again, with no worker ready in between: the server stops
    g.now += 0.1
    assert g.slots.step() is False and g.slots.failed
    assert g.killed == []  # the old worker was never told to retire


def test_deaths_at_start_are_counted_only_until_a_worker_gets_ready() -> None:
    f = Fakes(bound_mb=0)
    f.step(MIN_UPTIME_S)
    for _ in range(5):  # each killed right after its start, each successor ready before the next death
        f.proc(1).exitcode = -9
        f.step(0.1)
        f.shared.ready[1] = 1
        f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(1, "crash")] * 5 and not f.slots.failed


def test_the_worker_most_past_the_bound_is_replaced_first_then_the_oldest() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150, f.proc(1).pid: 180}  # type: ignore[dict-item]
    f.step()
    assert f.started[2][:2] == (2, "memory") and f.slots.slots[2].replaces == 1  # type: ignore[union-attr]

    g = Fakes()  # equal: the one started first, so that a bound every worker passes rotates through all
    g.shared.ready[0] = g.shared.ready[1] = 1
    g.slots.slots[0].started += 1  # type: ignore[union-attr]  # worker 1 is the older
    g.memory_mb = {g.proc(0).pid: 150, g.proc(1).pid: 150}  # type: ignore[dict-item]
    g.step()
    assert g.slots.slots[2].replaces == 1  # type: ignore[union-attr]


def test_a_worker_still_alive_long_after_the_stop_is_killed() -> None:
    f = Fakes(bound_mb=0)
    f.slots.signal_all(signal.SIGTERM)
    f.proc(0).exitcode = 0  # drained and exited; worker 1 hangs
    f.now += f.slots.stop_kill_s
    f.slots.reap_stopping()
    assert f.killed == [(f.proc(0).pid, signal.SIGTERM), (f.proc(1).pid, signal.SIGTERM)]
    f.now += 1
    f.slots.reap_stopping()
    f.slots.reap_stopping()  # once
    assert f.killed[2:] == [(f.proc(1).pid, signal.SIGKILL)]


def test_a_worker_that_crashes_while_its_replacement_starts_is_taken_over_by_it() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    f.memory_mb = {f.proc(0).pid: 150}  # type: ignore[dict-item]
    f.step(MIN_UPTIME_S)
    f.proc(0).exitcode = -9
    f.step(0.1)
    assert len(f.started) == 3 and f.slots.slots[0] is None  # no second replacement
    assert f.serving() == [0, 1, 1] and not Cluster(f.shared, 1).all_ready()  # until it is ready
    f.shared.ready[2] = 1
    assert Cluster(f.shared, 1).all_ready()


def test_a_crashed_worker_is_replaced_in_its_slot_as_a_crash() -> None:
    f = Fakes(bound_mb=0)
    f.step(MIN_UPTIME_S)
    f.proc(1).exitcode = -9
    f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(1, "crash")]


def test_a_stuck_retiring_worker_is_killed() -> None:
    f = Fakes()
    f.shared.ready[0] = f.shared.ready[1] = 1
    old = f.proc(0)
    f.memory_mb = {old.pid: 150}  # type: ignore[dict-item]
    f.step()
    f.shared.ready[2] = 1
    f.step(0.1)
    f.step(f.slots.retire_kill_s + 1)
    assert f.killed == [(old.pid, RETIRE_SIGNAL), (old.pid, signal.SIGKILL)]


def test_workers_that_die_before_getting_ready_stop_the_server_however_long_each_took() -> None:
    f = Fakes(bound_mb=0)
    for _ in range(EARLY_DEATHS - 1):  # e.g. a warm-up that fails after minutes: exit status 1, never ready
        f.step(10 * MIN_UPTIME_S)
        f.proc(1).exitcode = 1
        f.step(0.1)
    assert [(i, why) for i, why, _ in f.started[2:]] == [(1, "crash")] * (EARLY_DEATHS - 1)
    f.now += 10 * MIN_UPTIME_S
    f.proc(1).exitcode = 1
    assert f.slots.step() is False and f.slots.failed
