"""Background's floor: work less urgent than the default gets a share of the modelled time, under any load.

A deficit account per queue, in the cost model's unit (docs/architecture.md): each batch while background
waits beside more urgent work adds ``share`` × its cost and takes off the worth of the background it held.
"""

from __future__ import annotations

# A floor batch is the cheapest window doing at least this share of the best useful work per second the
# queue offers: small on a CPU (one input is nearly as efficient as eight), full on a GPU (it is not).
THRIFT = 0.8


class Floor:
    """What background work is owed (model units; positive: it is served next)."""

    __slots__ = ("owed", "share")

    def __init__(self, share: float) -> None:
        self.share = share
        self.owed = 0.0

    def due(self) -> bool:
        return self.share > 0 and self.owed > 0

    def account(self, cost: float, worth: float, bound: float) -> None:
        """A batch of ``cost`` ran, holding background inputs of ``worth``; ``bound``: a full batch's cost."""
        owed = self.owed + self.share * cost - worth
        self.owed = min(bound, max(-bound, owed))

    def clear(self) -> None:  # no background work waits
        self.owed = 0.0
