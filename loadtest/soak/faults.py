"""The soak's faults (``python -m loadtest.soak --faults kill@25%,redis@50%,bound``): their schedule, the
Redis the soak starts for them, which worker slot each process of the server fills, and every request's
fate (:func:`fate_of`) and fault (:func:`tag`). docs/performance.md says what each fault does and what it
may cost.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field

from loadtest.server import free_port

KILL = "kill"
REDIS = "redis"
BOUND = "bound"
TERM = "term"
LOST_WORKER = "worker lost"  # a worker gone that no fault of the soak's explains
KINDS = (KILL, REDIS, BOUND, TERM)
NONE = "none"
ON_KILLED = "kill: on the killed worker"
IN_FLIGHT_AT_TERM = "term: in flight"
# The fates each fault's requests may have; anything else is a loss the soak reports as a failure.
ANSWERED = ("200", "200 + retried")
ALLOWED: dict[str, tuple[str, ...] | None] = {
    NONE: ANSWERED,
    ON_KILLED: None,  # whatever a kill -9 does to what the killed worker held
    KILL: ANSWERED,
    REDIS: ANSWERED,
    BOUND: ANSWERED,
    LOST_WORKER: ANSWERED,
    IN_FLIGHT_AT_TERM: (*ANSWERED, "HTTP 503", "HTTP 503 + retried"),
}
ROWS = (NONE, ON_KILLED, KILL, REDIS, BOUND, LOST_WORKER, IN_FLIGHT_AT_TERM)


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    # Seconds into the soak; None for ``bound`` (it fires on its own) and ``term`` (the end).
    at_s: float | None


_TIME = re.compile(r"^(\d+(?:\.\d+)?)(s|m|%)$")


def parse_faults(spec: str, seconds: float, bound: bool) -> list[Fault]:
    """The faults of ``--faults`` for a soak of ``seconds``, in time order, ``term`` last (added when
    there are any); ``bound``: whether ``--worker-max-memory-mb`` is given (``default`` then includes it).

    Raises:
        FaultSpecError: an unknown fault, a time outside the soak, or ``bound`` without a bound.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return []
    if spec == "default":
        spec = "kill@25%,redis@50%" + (",bound" if bound else "")
    faults: list[Fault] = []
    for item in spec.split(","):
        kind, _, when = item.strip().partition("@")
        if kind not in KINDS:
            raise FaultSpecError(f"unknown fault {kind!r} in {spec!r}; faults: {', '.join(KINDS)}")
        if kind in (BOUND, TERM):
            if when:
                raise FaultSpecError(
                    f"{kind} takes no time: "
                    + (
                        "it is the end"
                        if kind == TERM
                        else "it fires when a worker's PSS passes --worker-max-memory-mb"
                    )
                )
            if kind == BOUND and not bound:
                raise FaultSpecError(
                    "bound needs --worker-max-memory-mb: the PSS at which a worker is replaced"
                )
            faults.append(Fault(kind, None))
            continue
        match = _TIME.match(when)
        if match is None:
            raise FaultSpecError(
                f"{item!r}: the time is NUMBER then s, m or % (kill@90s, kill@12m, kill@25%)"
            )
        value, unit = float(match[1]), match[2]
        at = value * {"s": 1.0, "m": 60.0, "%": seconds / 100}[unit]
        if not 0 < at < seconds:
            raise FaultSpecError(f"{item!r}: at {at:.0f} s, outside the soak's {seconds:.0f} s")
        faults.append(Fault(kind, at))
    timed = sorted((f for f in faults if f.at_s is not None), key=lambda f: f.at_s or 0.0)
    return [*timed, *dict.fromkeys(f for f in faults if f.kind == BOUND), Fault(TERM, None)]


@dataclass
class FaultEvent:
    """What happened: a fault the soak caused, or a worker replaced on its own (the bound, a crash)."""

    kind: str
    start_s: float  # seconds into the soak
    # When it was over (the replacement seen, Redis back, the old worker gone); None: never.
    end_s: float | None
    detail: str
    on_killed: list[int] = field(default_factory=list)  # kill: ids of the requests in flight on the worker


@dataclass(frozen=True)
class Request:
    id: int
    sent_s: float  # seconds into the soak it was written (its slot, or later when the pool was busy)
    ended_s: float  # when its fate was known
    fate: str


def fate_of(status: int | None, error: BaseException | None, received: bool, retried: bool) -> str:
    """A request's fate from its answer's status or the error it ended with (module docstring)."""
    if error is None:
        text = str(status) if status == 200 else f"HTTP {status}"
    elif isinstance(error, ConnectionRefusedError):
        text = "refused: no connection"
    elif isinstance(error, (ConnectionError, EOFError)):  # IncompleteReadError is an EOFError
        text = "lost: answer cut" if received else "lost: no answer"
    else:
        text = f"error: {type(error).__name__}"
    return text + (" + retried" if retried else "")


def tag(request: Request, events: list[FaultEvent], settle_s: float) -> str:
    """The fault a request is counted under (module docstring)."""
    for e in events:
        if e.kind == KILL and request.id in e.on_killed:
            return ON_KILLED
    for e in events:
        if e.kind == TERM and request.ended_s >= e.start_s:
            return IN_FLIGHT_AT_TERM
    for e in events:
        if e.kind == TERM:
            continue
        end = float("inf") if e.end_s is None else e.end_s + settle_s
        if request.sent_s <= end and request.ended_s >= e.start_s:
            return e.kind
    return NONE


def fate_table(
    requests: list[Request], events: list[FaultEvent], settle_s: float
) -> dict[str, dict[str, int]]:
    """Fault → fate → requests, the rows in :data:`ROWS` order (only those with requests)."""
    table: dict[str, dict[str, int]] = {}
    for r in requests:
        row = table.setdefault(tag(r, events, settle_s), {})
        row[r.fate] = row.get(r.fate, 0) + 1
    return {k: dict(sorted(table[k].items())) for k in ROWS if k in table}


def losses(table: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per fault, the requests whose fate that fault does not allow (:data:`ALLOWED`); only non-zero."""
    out = {}
    for row, fates in table.items():
        allowed = ALLOWED[row]
        if allowed is not None and (n := sum(c for f, c in fates.items() if f not in allowed)):
            out[row] = n
    return out


def render_table(table: dict[str, dict[str, int]]) -> str:
    fates = sorted({f for row in table.values() for f in row}, key=lambda f: (f not in ANSWERED, f))
    width = max([len(r) for r in table] + [5])
    lines = [f"{'fault':<{width}}  " + "  ".join(f"{f:>{max(len(f), 5)}}" for f in fates)]
    for row, counts in table.items():
        lines.append(f"{row:<{width}}  " + "  ".join(f"{counts.get(f, 0):>{max(len(f), 5)}}" for f in fates))
    return "\n".join(lines)


class Slots:
    """Which worker slot each worker pid fills, from successive readings of the tree's worker pids.

    The supervisor keeps N workers and replaces one in place; /proc does not say which, so: the workers
    of the first reading fill slots 0…N-1 by pid; a pid that is gone frees its slot; a new pid takes a
    free slot, or, when none is (a replacement that starts before the old one stops: the memory bound),
    waits until one frees. Each change is returned from :meth:`update` as an event.
    """

    def __init__(self, pids: list[int]) -> None:
        self.of: dict[int, int] = {pid: i for i, pid in enumerate(sorted(pids))}
        self.live = set(pids)
        self.free: list[int] = []
        self.pending: dict[int, float] = {}  # new pid → when first seen, while no slot is free

    def update(self, pids: list[int], t: float) -> list[tuple[str, int, int | None, float]]:
        """``("gone", pid, slot, t)`` for each pid no longer there, then ``("new", pid, slot, since)``
        for each new pid given a slot (``since``: first seen), ``("waiting", pid, None, t)`` for a new
        pid with none free yet."""
        changes: list[tuple[str, int, int | None, float]] = []
        now = set(pids)
        for pid in sorted(self.live - now):
            self.live.discard(pid)
            if pid in self.pending:
                del self.pending[pid]
                continue
            self.free.append(self.of[pid])
            changes.append(("gone", pid, self.of[pid], t))
        for pid in sorted(now - self.live):
            self.live.add(pid)
            self.pending[pid] = t
            if not self.free:
                changes.append(("waiting", pid, None, t))
        self.free.sort()
        for pid in sorted(self.pending, key=lambda p: self.pending[p]):
            if not self.free:
                break
            self.of[pid] = self.free.pop(0)
            changes.append(("new", pid, self.of[pid], self.pending.pop(pid)))
        return changes

    def slot(self, pid: int) -> int | None:
        return self.of.get(pid)

    def holder(self, slot: int) -> int | None:
        """The live pid in ``slot``."""
        return next((p for p, s in self.of.items() if s == slot and p in self.live), None)


class RedisServer:
    """``redis-server`` on a free loopback port, nothing saved, stopped and started at will on that port."""

    def __init__(self, binary: str, max_memory_mb: int) -> None:
        found = shutil.which(binary)
        if found is None:
            raise RuntimeError(
                f"{binary} not found: the faults need a redis-server (apt-get install redis-server)"
            )
        self.binary = found
        self.max_memory_mb = max_memory_mb
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        # Bounded, evicting the oldest: the soak's texts are all distinct, and Redis is outside the tree
        # whose memory the soak reads.
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory",
                f"{self.max_memory_mb}mb",
                "--maxmemory-policy",
                "allkeys-lru",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
