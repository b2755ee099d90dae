"""Who is interactive: a request's urgency as RFC 9218 numbers it (0 most urgent … 7 background, 3 default).

The API layer sets :data:`URGENCY` in the request's task; the engine reads it at admission and in each
:class:`~app.engine.work.Job`. The tasks in between never see it.
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
    """One level more urgent for each ``aging_s`` since ``since`` (last served, or queued)."""
    return urgency - int((now - since) / aging_s)


def admission_limit(limit: int, urgency: int) -> int:
    """Inputs in flight up to which a request of ``urgency`` is admitted (never under one)."""
    if urgency <= DEFAULT_URGENCY:
        return limit
    return max(1, int(limit * (1 - BUDGET_STEP * (urgency - DEFAULT_URGENCY))))
