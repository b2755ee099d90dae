"""The server as a benchmark sees it: the tree of processes under one pid (the server, its workers and
whatever they start), each one's memory (RSS, PSS, USS, peak RSS) and CPU time, from /proc. The one place
a benchmark reads a server's memory or CPU; docs/performance.md (the soak) says what each figure counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MB = 2**20
# Where multiprocessing's spawn start method puts the processes it starts (the supervisor's workers):
# their command line ends with this flag. Its resource tracker runs this module instead.
SPAWNED = "--multiprocessing-fork"
RESOURCE_TRACKER = "multiprocessing.resource_tracker"
LISTEN = "0A"  # a socket's state in /proc/net/tcp (include/net/tcp_states.h)
T = TypeVar("T")


def _stat(path: Path) -> list[str]:
    """The fields of ``path``/stat (a process's or a thread's) after the command name, the state first."""
    return (path / "stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, …), from each process's parent id."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):  # one folder a process
        try:
            parent = int(_stat(entry)[1])
        except (OSError, IndexError, ValueError):  # it ended while we looked
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s threads, plus what its ended children used."""
    fields = _stat(Path(f"/proc/{pid}"))
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS  # utime, stime, cutime, cstime


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each of ``pid``'s live threads, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # not /proc/TID/stat: that one is the whole process's
            fields = _stat(task)
        except OSError:  # the thread ended
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def _over_tree(pid: int, read: Callable[[int], T]) -> list[T]:
    """``read`` of ``pid`` and of each live descendant (one that ends meanwhile is left out; ``pid`` raises)."""
    found: list[T] = []
    for p in (pid, *descendants(pid)):
        try:
            found.append(read(p))
        except (OSError, IndexError, ValueError):  # a descendant ended between the listing and here
            if p == pid:
                raise
    return found


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` summed over ``pid`` and all its live descendants."""
    return sum(_over_tree(pid, cpu_seconds))


@dataclass(frozen=True)
class Memory:
    """Bytes of one process, or a sum over several (module docstring: what each counts)."""

    rss: int = 0
    pss: int = 0
    uss: int = 0
    peak_rss: int = 0  # VmHWM: the most RSS so far; over a tree, the sum of each one's peak (an upper bound)


def _kb(path: Path, keys: tuple[str, ...]) -> dict[str, int]:
    """``Key:  N kB`` lines of a /proc file, in bytes, summed per key (over each mapping of smaps)."""
    out = dict.fromkeys(keys, 0)
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in out:
            out[key] += int(rest.split()[0]) * 1024
    return out


def peak_rss(pid: int) -> int:
    """The most RSS ``pid`` has had (``VmHWM``; 0 once it has exited): a cheap read, OSError once it is gone."""
    return _kb(Path(f"/proc/{pid}/status"), ("VmHWM",))["VmHWM"]


def memory(pid: int) -> Memory:
    """RSS, PSS, USS and peak RSS of one process now (OSError: it is gone, or not ours to read)."""
    smaps = Path(f"/proc/{pid}/smaps_rollup")
    if not smaps.exists():  # Linux before 4.14
        smaps = Path(f"/proc/{pid}/smaps")
    m = _kb(smaps, ("Rss", "Pss", "Private_Clean", "Private_Dirty"))
    return Memory(m["Rss"], m["Pss"], m["Private_Clean"] + m["Private_Dirty"], peak_rss(pid))


def role(pid: int, root: int) -> str:
    """What a process of the tree is: ``server`` (the root), ``worker`` (a process multiprocessing
    spawned: the supervisor's workers), ``resource tracker`` (multiprocessing's), else its command name."""
    if pid == root:
        return "server"
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if RESOURCE_TRACKER.encode() in b" ".join(cmdline):
        return "resource tracker"
    if SPAWNED.encode() in cmdline:
        return "worker"
    return Path(f"/proc/{pid}/comm").read_text().strip()


@dataclass(frozen=True)
class Process:
    pid: int
    role: str
    memory: Memory
    cpu_s: float


@dataclass(frozen=True)
class Tree:
    """One reading of a process tree: the root first, then its live descendants."""

    processes: tuple[Process, ...]

    @property
    def memory(self) -> Memory:
        """Each figure summed over the processes."""
        return Memory(*(sum(getattr(p.memory, f.name) for p in self.processes) for f in fields(Memory)))

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)

    @property
    def workers(self) -> tuple[Process, ...]:
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
    """The client ports of the TCP connections to local ``port`` that ``pid`` holds (OSError: it is gone):
    which of a load generator's connections a worker serves, from the socket inodes of /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], int(fields[9])
            if inode in inodes and fields[3] != LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                found.add(int(remote.rsplit(":", 1)[1], 16))
    return found


def tree(pid: int) -> Tree:
    """Memory and CPU of ``pid`` (OSError: it is gone) and each of its live descendants now; the root is
    named ``supervisor`` when it has workers."""
    found = _over_tree(pid, lambda p: Process(p, role(p, pid), memory(p), cpu_seconds(p)))
    if any(p.role == "worker" for p in found):
        found[0] = Process(pid, "supervisor", found[0].memory, found[0].cpu_s)
    return Tree(tuple(found))
