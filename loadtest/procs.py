"""The server as a benchmark sees it: the tree of processes under one pid (the server, its workers and
whatever they start), each one's memory (RSS, PSS, USS, peak RSS) and CPU time, read with psutil. The one
place a benchmark reads a server's memory or CPU; docs/performance-log.md (the soak) says what each figure
counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import psutil

MB = 2**20
# Where multiprocessing's spawn start method puts the processes it starts (the supervisor's workers):
# their command line ends with this flag. Its resource tracker runs this module instead.
SPAWNED = "--multiprocessing-fork"
RESOURCE_TRACKER = "multiprocessing.resource_tracker"


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, …)."""
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s threads, plus what its ended children used."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each of ``pid``'s live threads, by thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` summed over ``pid`` and all its live descendants (their memory unread: a read of
    it walks each process's page tables, and a benchmark reads CPU time right before and after a cell)."""
    total = 0.0
    for p in (pid, *descendants(pid)):
        try:
            total += cpu_seconds(p)
        except psutil.Error:  # a descendant ended between the listing and here
            if p == pid:
                raise
    return total


@dataclass(frozen=True)
class Memory:
    """Bytes of one process, or a sum over several (module docstring: what each counts)."""

    rss: int = 0
    pss: int = 0
    uss: int = 0
    peak_rss: int = 0  # VmHWM: the most RSS so far; over a tree, the sum of each one's peak (an upper bound)


def peak_rss(pid: int) -> int:
    """The most RSS ``pid`` has had (``VmHWM``, which psutil does not read; 0 once it has exited): a cheap
    read, OSError once it is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def memory(pid: int) -> Memory:
    """RSS, PSS, USS and peak RSS of one process now (psutil.Error: it is gone, or not ours to read)."""
    m = psutil.Process(pid).memory_full_info()
    return Memory(m.rss, m.pss, m.uss, peak_rss(pid))


def role(process: psutil.Process, root: int) -> str:
    """What a process of the tree is: ``server`` (the root), ``worker`` (a process multiprocessing
    spawned: the supervisor's workers), ``resource tracker`` (multiprocessing's), else its command name."""
    if process.pid == root:
        return "server"
    cmdline = process.cmdline()
    if RESOURCE_TRACKER in " ".join(cmdline):
        return "resource tracker"
    return "worker" if SPAWNED in cmdline else process.name()


@dataclass(frozen=True)
class ProcessReading:
    pid: int
    role: str
    memory: Memory
    cpu_s: float


@dataclass(frozen=True)
class Tree:
    """One reading of a process tree: the root first, then its live descendants."""

    processes: tuple[ProcessReading, ...]

    @property
    def memory(self) -> Memory:
        """Each figure summed over the processes."""
        return Memory(*(sum(getattr(p.memory, f.name) for p in self.processes) for f in fields(Memory)))

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)

    @property
    def workers(self) -> tuple[ProcessReading, ...]:
        return tuple(p for p in self.processes if p.role == "worker")

    def as_json(self) -> dict[str, Any]:
        """The tree's sums (bytes, seconds) and each process's figures, for a report's JSON."""
        return {
            **asdict(self.memory),
            "cpu_s": self.cpu_s,
            "processes": [
                {"pid": p.pid, "role": p.role, **asdict(p.memory), "cpu_s": p.cpu_s} for p in self.processes
            ],
        }


def peer_ports(pid: int, port: int) -> set[int]:
    """The client ports of the TCP connections to local ``port`` that ``pid`` holds (psutil.Error: it is
    gone): which of a load generator's connections a worker serves."""
    held = psutil.Process(pid).net_connections("tcp")
    return {c.raddr.port for c in held if c.raddr and c.status != psutil.CONN_LISTEN and c.laddr.port == port}


def tree(pid: int) -> Tree:
    """Memory and CPU of ``pid`` (psutil.Error: it is gone) and each of its live descendants now; the root
    is named ``supervisor`` when it has workers. A descendant that ends while it is read is left out."""
    root = psutil.Process(pid)
    found: list[ProcessReading] = []
    for p in (root, *root.children(recursive=True)):
        try:
            found.append(ProcessReading(p.pid, role(p, pid), memory(p.pid), cpu_seconds(p.pid)))
        except (psutil.Error, OSError):
            if p.pid == pid:
                raise
    if any(p.role == "worker" for p in found):
        found[0] = ProcessReading(pid, "supervisor", found[0].memory, found[0].cpu_s)
    return Tree(tuple(found))
