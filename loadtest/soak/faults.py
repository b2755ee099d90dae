"""The soak's faults (``--faults``): their schedule (the Redis they stop is
:class:`loadtest.server.RedisServer`), which worker slot each process of the server fills, and every request's
fate and the fault it met. docs/performance-log.md says what each fault does and what it may cost.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

KILL = "kill"
REDIS = "redis"
BOUND = "bound"
TERM = "term"
KINDS = (KILL, REDIS, BOUND, TERM)
LOST_WORKER = "worker lost"  # a worker gone that no fault of the soak's explains
NONE = "none"
ON_KILLED = "kill: on the killed worker"
IN_FLIGHT_AT_TERM = "term: in flight"
ANSWERED = ("200", "200 + retried")
Table = dict[str, dict[str, int]]  # fault → fate → requests
# The fates each fault's requests may have, in the fate table's order; any other is a loss.
ALLOWED: dict[str, tuple[str, ...] | None] = {
    NONE: ANSWERED,
    ON_KILLED: None,  # whatever a kill -9 does to what the killed worker held
    KILL: ANSWERED,
    REDIS: ANSWERED,
    BOUND: ANSWERED,
    LOST_WORKER: ANSWERED,
    IN_FLIGHT_AT_TERM: (*ANSWERED, "HTTP 503", "HTTP 503 + retried"),
}


class FaultSpecError(ValueError):
    """A ``--faults`` that cannot run."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float | None  # seconds into the soak; None for bound (it fires on its own) and term (the end)


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
    items = [item.strip().partition("@") for item in spec.split(",")]
    timed: list[tuple[float, str]] = []
    for kind, _, when in items:
        if kind not in KINDS:
            raise FaultSpecError(f"unknown fault {kind!r} in {spec!r}; faults: {', '.join(KINDS)}")
        if kind in (BOUND, TERM):
            if when:
                why = "it is the end" if kind == TERM else "it fires when a worker's PSS passes the bound"
                raise FaultSpecError(f"{kind} takes no time: {why}")
            if kind == BOUND and not bound:
                raise FaultSpecError("bound needs --worker-max-memory-mb: the PSS that replaces a worker")
            continue
        match = _TIME.match(when)
        if match is None:
            raise FaultSpecError(f"{kind}@{when}: the time is NUMBER then s, m or % (90s, 12m, 25%)")
        at = float(match[1]) * {"s": 1.0, "m": 60.0, "%": seconds / 100}[match[2]]
        if not 0 < at < seconds:
            raise FaultSpecError(f"{kind}@{when}: at {at:.0f} s, outside the soak's {seconds:.0f} s")
        timed.append((at, kind))
    bounds = [Fault(BOUND, None)] if any(kind == BOUND for kind, _, _ in items) else []
    return [*(Fault(kind, at) for at, kind in sorted(timed)), *bounds, Fault(TERM, None)]


@dataclass
class FaultEvent:
    """What happened: a fault the soak caused, or a worker replaced on its own (the bound, a crash)."""

    kind: str
    start_s: float  # seconds into the soak
    end_s: float | None  # when it was over (the replacement ready, Redis back, …); None: never
    detail: str
    on_killed: list[int] = field(default_factory=list)  # kill: ids of the requests in flight on the worker


@dataclass(frozen=True)
class SentRequest:
    id: int
    sent_s: float  # seconds into the soak it was written (its slot, or later when the pool was busy)
    ended_s: float  # when its fate was known
    fate: str


def fate_of(status: int | None, error: BaseException | None, received: bool, retried: bool) -> str:
    """A request's fate: its answer's status, or how it was lost; ``+ retried`` when it was sent again."""
    if error is None:
        text = str(status) if status == 200 else f"HTTP {status}"
    elif isinstance(error, ConnectionRefusedError):
        text = "refused: no connection"
    elif isinstance(error, (ConnectionError, EOFError)):  # IncompleteReadError is an EOFError
        text = "lost: answer cut" if received else "lost: no answer"
    else:
        text = f"error: {type(error).__name__}"
    return text + (" + retried" if retried else "")


def tag(request: SentRequest, events: list[FaultEvent], settle_s: float) -> str:
    """The fault a request is counted under: on the killed worker, in flight at the SIGTERM, or the first
    fault whose window (its start to its end plus ``settle_s``) overlaps the request's life."""
    if any(e.kind == KILL and request.id in e.on_killed for e in events):
        return ON_KILLED
    if any(e.kind == TERM and request.ended_s >= e.start_s for e in events):
        return IN_FLIGHT_AT_TERM
    for e in events:
        end = math.inf if e.end_s is None else e.end_s + settle_s
        if e.kind != TERM and request.sent_s <= end and request.ended_s >= e.start_s:
            return e.kind
    return NONE


def fate_table(requests: list[SentRequest], events: list[FaultEvent], settle_s: float) -> Table:
    """Fault → fate → requests, the rows in :data:`ALLOWED` order (only those with requests)."""
    table: dict[str, Counter[str]] = {}
    for r in requests:
        table.setdefault(tag(r, events, settle_s), Counter())[r.fate] += 1
    return {k: dict(sorted(table[k].items())) for k in ALLOWED if k in table}


def losses(table: Table) -> dict[str, int]:
    """Per fault, the requests whose fate that fault does not allow (:data:`ALLOWED`); only non-zero."""
    out = {}
    for row, fates in table.items():
        allowed = ALLOWED[row]
        if allowed is not None and (n := sum(c for f, c in fates.items() if f not in allowed)):
            out[row] = n
    return out


def render_table(table: Table) -> str:
    fates = sorted({f for row in table.values() for f in row}, key=lambda f: (f not in ANSWERED, f))
    width = max([len(r) for r in table] + [5])
    lines = [f"{'fault':<{width}}  " + "  ".join(f"{f:>{max(len(f), 5)}}" for f in fates)]
    for row, counts in table.items():
        lines.append(f"{row:<{width}}  " + "  ".join(f"{counts.get(f, 0):>{max(len(f), 5)}}" for f in fates))
    return "\n".join(lines)


class PidSlots:
    """Which worker slot each worker pid fills, from successive readings: the first reading's workers fill
    slots 0…N-1 by pid; a pid that is gone frees its slot; a new pid takes a free slot or, while none is (a
    replacement that starts before the old one stops: the memory bound), waits for one."""

    def __init__(self, pids: list[int]) -> None:
        self.of: dict[int, int] = {pid: i for i, pid in enumerate(sorted(pids))}
        self.live = set(pids)
        self.pending: dict[int, float] = {}  # new pid → when first seen, while no slot is free

    def update(self, pids: list[int], t: float) -> list[tuple[str, int, int | None, float]]:
        """``("gone", pid, slot, t)`` for each pid no longer there, then ``("new", pid, slot, since)``
        for each new pid given a slot (``since``: first seen), ``("waiting", pid, None, t)`` for a new
        pid with none free yet."""
        changes: list[tuple[str, int, int | None, float]] = []
        for pid in sorted(self.live - set(pids)):
            self.live.discard(pid)
            if self.pending.pop(pid, None) is None:
                changes.append(("gone", pid, self.of[pid], t))
        free = sorted(set(self.of.values()) - {self.of[p] for p in self.live if p in self.of})
        for pid in sorted(set(pids) - self.live):
            self.live.add(pid)
            self.pending[pid] = t
            if not free:
                changes.append(("waiting", pid, None, t))
        for pid in sorted(self.pending, key=lambda p: self.pending[p])[: len(free)]:
            self.of[pid] = free.pop(0)
            changes.append(("new", pid, self.of[pid], self.pending.pop(pid)))
        return changes

    def slot(self, pid: int) -> int | None:
        return self.of.get(pid)
