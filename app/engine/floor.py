"""Background's floor: work less urgent than the default gets a share of the modelled time, under any load.

Aging alone (:mod:`app.engine.batching`) lets a waiting background class in once per few seconds: under
interactive work that never pauses, a ``u=7`` client got 4 % of the inputs, spread over every request it
had waiting, so none finished. The floor is a deficit account, per queue, in the cost model's unit:

- While background work (:data:`~app.engine.priority.BACKGROUND`) waits beside more urgent work, each batch
  adds ``share`` × its modelled cost to what background is *owed*, and takes off the *worth* of the
  background inputs it held (what they cost in the best batch they could be in:
  :meth:`~app.engine.planner.Planner.worth`, whether they rode along as fill or had a batch of their own).
  So background gets ``share`` of the time in useful work, whatever its batches' shapes.
- While something is owed, the next batch is background's: of the windows whose useful work per second
  is nearly the best the queue offers (:data:`THRIFT`), the cheapest that pays what is owed (on a CPU, a
  few inputs; on a GPU, where a batch costs about its launch, a full one). So background runs in one
  small batch after each more urgent one, or after every few, and delays more urgent work by little.
- What is owed is bounded both ways by one full batch (at a share of 0.1, a window over about the last
  ten, not a bank):
  filling more than its share never silences background for long, and a long wait never owes a burst.
  Nothing waiting, nothing owed.

Within background, requests are served whole and the oldest first (:meth:`~app.engine.pending.Pending.front`),
so under the floor requests finish at its rate instead of all of them crawling.
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
        """Whether the next batch is background's."""
        return self.share > 0 and self.owed > 0

    def account(self, cost: float, worth: float, bound: float) -> None:
        """A batch of modelled ``cost`` ran while background waited beside more urgent work, holding
        background inputs of ``worth``; ``bound``: what one full batch costs."""
        owed = self.owed + self.share * cost - worth
        self.owed = min(bound, max(-bound, owed))

    def clear(self) -> None:
        """No background work waits: nothing is owed, either way."""
        self.owed = 0.0
