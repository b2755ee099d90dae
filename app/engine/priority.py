"""Who is interactive: a request's urgency, as RFC 9218 numbers it (0 most urgent … 7 background, 3 default).

The API layer reads it from the request (the ``Priority`` header, gRPC metadata ``priority``, or the API
key's default) and sets :data:`URGENCY` in the request's task; the engine reads it where a request enters:
admission (:meth:`app.engine.engine.Engine.admit`) and each :class:`~app.engine.work.Job` it creates. The
tasks in between never see it. What the engine does with it: admission refuses less urgent requests first
(:func:`admission_limit`), and the assembler serves the most urgent work first, fills its batches with less
urgent work where the cost model says that is nearly free, ages waiting work so none starves
(:mod:`app.engine.batching`), and keeps a floor for work less urgent than the default (:data:`BACKGROUND`):
a share of the modelled time under any load, spent on its requests whole, the oldest first
(:mod:`app.engine.floor`).
"""

from __future__ import annotations

from contextvars import ContextVar

DEFAULT_URGENCY = 3  # RFC 9218 §4.1: "The default value is 3"
URGENCIES = range(8)  # 0 … 7; also the bounded label set of the urgency metrics
# Background: less urgent than the default (u=4 … u=7). Its requests are served whole, the oldest first,
# and together get the setting background_share of the modelled time while more urgent work is pending.
BACKGROUND = range(DEFAULT_URGENCY + 1, len(URGENCIES))

# The urgency of the request served in this task; the default outside any request (warm-up).
URGENCY: ContextVar[int] = ContextVar("zhembed_urgency", default=DEFAULT_URGENCY)

# Each urgency level past the default gives up this share of the admission budget: u=4 may fill 7/8 of it,
# u=7 half, so a bulk client is refused while the rest stays free for interactive requests.
BUDGET_STEP = 1 / 8


def aged_level(urgency: int, since: float, now: float, aging_s: float) -> int:
    """The level waiting work of ``urgency`` counts at: one more urgent for each ``aging_s`` since
    ``since`` (when it was last served, or queued), so that nothing waits forever behind more urgent work."""
    return urgency - int((now - since) / aging_s)


def admission_limit(limit: int, urgency: int) -> int:
    """Inputs in flight (server-wide) up to which a request of ``urgency`` is admitted: the whole budget at
    the default urgency and more urgent ones, less for each level past it (never under one input)."""
    if urgency <= DEFAULT_URGENCY:
        return limit
    return max(1, int(limit * (1 - BUDGET_STEP * (urgency - DEFAULT_URGENCY))))
