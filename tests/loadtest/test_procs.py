"""loadtest.procs: a process tree's pids, memory and CPU time, on real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadtest import procs

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(60)"
MB = procs.MB
SHARED_MB = 48
OWN_MB = 32
# A parent that writes SHARED_MB, then forks two children that each write OWN_MB of their own: the
# parent's pages stay shared with the children (copy on write, never written again).
FORKS = f"""
import os, time
shared = b"s" * ({SHARED_MB} * 2**20)
r, w = os.pipe()
for _ in range(2):
    if os.fork() == 0:
        own = b"p" * ({OWN_MB} * 2**20)
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
os.read(r, 1), os.read(r, 1)
print("ready", flush=True)
time.sleep(60)
"""
# A supervisor as the service's is: workers started by multiprocessing's spawn, and a lock, whose
# semaphore starts multiprocessing's resource tracker.
SPAWNS = """
import multiprocessing as mp, time
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    workers = [ctx.Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for w in workers:
        w.start()
    print("ready", flush=True)
    time.sleep(60)
"""


def _own_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _started(script: str) -> Iterator[subprocess.Popen[str]]:
    """``python -c script`` in a session of its own, once it printed ``ready``; the whole group is
    killed after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_cpu_time_includes_the_worker_processes() -> None:
    # A parent that only waits, and a child (a "worker") that burns 0.5 s of CPU and then idles.
    parent = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$BURN" & wait'],
        env={**os.environ, "BURN": BURN},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while procs.tree_cpu_seconds(parent.pid) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(procs.descendants(parent.pid)) == 1
        assert procs.tree_cpu_seconds(parent.pid) >= 0.45
        assert _own_cpu_seconds(parent.pid) < 0.2
        tree = procs.tree(parent.pid)
        assert tree.processes[0].pid == parent.pid
        assert tree.cpu_s >= 0.45 and tree.processes[0].cpu_s < 0.2
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_thread_cpu_is_counted_for_the_thread_that_spent_it() -> None:
    burnt, done = threading.Event(), threading.Event()

    def burn() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass
        burnt.set()
        done.wait()

    busy, idle = threading.Thread(target=burn), threading.Thread(target=done.wait)
    busy.start()
    idle.start()
    burnt.wait()
    seconds = procs.thread_cpu_seconds(os.getpid())
    done.set()
    busy.join()
    idle.join()
    assert seconds[busy.native_id or -1] >= 0.25
    assert seconds[idle.native_id or -1] < 0.05
    # join() returns once the thread's Python code is done; the kernel drops its task a moment later
    deadline = time.monotonic() + 30
    while busy.native_id in procs.thread_cpu_seconds(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert busy.native_id not in procs.thread_cpu_seconds(os.getpid())  # an ended thread is gone


def test_the_tree_holds_every_child_and_each_process_its_own_memory() -> None:
    with _started(FORKS) as parent:
        tree = procs.tree(parent.pid)
        root, *children = tree.processes
        assert root.pid == parent.pid and len(children) == 2
        assert {c.pid for c in children} == set(procs.descendants(parent.pid))
        for child in children:
            m = child.memory
            assert m.uss >= OWN_MB * MB  # what it wrote is its own
            assert m.uss < (OWN_MB + SHARED_MB / 2) * MB  # the parent's pages are not
            assert m.rss >= (OWN_MB + SHARED_MB) * MB  # RSS counts them in full,
            assert m.pss >= (OWN_MB + SHARED_MB / 3 - 2) * MB  # PSS a third each
            assert m.pss < (OWN_MB + SHARED_MB / 2) * MB
        assert root.memory.rss >= SHARED_MB * MB and root.memory.uss < SHARED_MB / 2 * MB
        total = tree.memory
        assert total.pss == sum(p.memory.pss for p in tree.processes)
        assert total.rss == sum(p.memory.rss for p in tree.processes)
        assert total.pss >= (SHARED_MB + 2 * OWN_MB) * MB  # the children count,
        assert total.rss - total.pss >= 1.5 * SHARED_MB * MB  # and RSS counts the shared pages thrice
        assert all(p.memory.peak_rss >= p.memory.rss for p in tree.processes)
        as_json = tree.as_json()
        assert as_json["pss"] == total.pss and as_json["rss"] == total.rss
        assert [p["pid"] for p in as_json["processes"]] == [p.pid for p in tree.processes]


def test_roles_name_the_supervisor_its_spawned_workers_and_the_tracker() -> None:
    expected = ["resource tracker", "supervisor", "worker", "worker"]
    with _started(SPAWNS) as parent:
        # multiprocessing's start() returns once its child is forked, before the child runs exec: until
        # then the child is a copy of the parent (its command line too).
        deadline = time.monotonic() + 20
        tree = procs.tree(parent.pid)
        while sorted(p.role for p in tree.processes) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
            tree = procs.tree(parent.pid)
        assert sorted(p.role for p in tree.processes) == expected
        assert tree.processes[0].role == "supervisor"
        assert len(tree.workers) == 2 and all(w.memory.pss > 0 for w in tree.workers)


def test_a_process_alone_is_the_server() -> None:
    tree = procs.tree(os.getpid())
    assert tree.processes[0].role == "server" and not tree.workers


def test_peer_ports_are_the_clients_of_the_connections_a_process_holds() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", port)) as mine,
            socket.create_connection(("127.0.0.1", port)),
        ):
            accepted, _ = listener.accept()  # held here; the second connection stays in the backlog
            with accepted:
                assert procs.peer_ports(os.getpid(), port) == {mine.getsockname()[1]}
        assert procs.peer_ports(os.getpid(), port) == set()
