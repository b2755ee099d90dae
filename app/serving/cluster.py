"""What the worker processes of one server share: their admission permits, ready flags and metrics
directory, in shared memory (the supervisor that starts them is :mod:`app.serving.supervisor`), and how many
workers to run.

What holds with N > 1, as with one process:

- **429 before queueing**, against ONE budget: the permits in use are counted per worker in shared memory
  (:class:`SharedLedger`) and a request is refused only when the server's total would pass
  ``max_concurrent_inputs`` (with several models, each model's own budget, over every worker). A worker
  that dies has its counts cleared when it is replaced.
- **/metrics shows every worker in one scrape**: prometheus-client's multiprocess mode (each worker
  writes its samples to files in a directory of the supervisor's; whichever worker answers the scrape
  reads them all).
- **/ready is true only when every serving worker is ready** (a ready flag and a serving flag per slot in
  shared memory). With ``worker_max_memory_mb`` set there is one slot more than workers, for the
  replacement of a worker past the bound (:mod:`app.serving.supervisor`): the supervisor marks the
  replacement serving only once it is ready, and the worker it replaces not serving from then on, so
  neither the starting replacement nor the retiring worker nor an empty slot turns /ready false.
- **Each worker's memory** as the supervisor measures it (:mod:`app.serving.memory`), for its gauge.
- Redis is shared as before; the in-process vector cache is per worker.

Nothing here imports the app or the supervisor: the routes and ``create_app`` read a :class:`Cluster`,
and the supervisor builds the :class:`Shared` it views.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Any

import onnxruntime as ort

from app.model.runtime import CPU, CUDA
from app.settings import Settings

# Workers when ZHEMBED_WORKERS is 0 (auto): 4 on CUDA (1 / 2 / 4 processes measured 2,560 / 4,333 / 7,136
# sentences/s on an H200), 1 on CPU, where ONNX Runtime's threads already use every core.
AUTO_CUDA_WORKERS = 4


def resolve_count(settings: Settings) -> int:
    """How many workers to run: the setting, or for auto 4 when CUDA is the first provider, else 1."""
    if settings.workers:
        return settings.workers
    return AUTO_CUDA_WORKERS if first_provider(settings) == CUDA else 1


def first_provider(settings: Settings) -> str:
    """The execution provider a worker's session will try first: the setting's, else CUDA if present."""
    wanted = settings.provider_list
    return wanted[0] if wanted else (CUDA if CUDA in ort.get_available_providers() else CPU)


@dataclass
class Shared:
    """What the workers of one server share, one entry per slot: permit counts, ready flags, serving flags
    and memory, and the metrics directory."""

    permits: SynchronizedArray[
        Any
    ]  # ctypes c_longlong per slot and model: slot i's model m at i × models + m
    ready: SynchronizedArray[Any]  # ctypes c_byte per slot: its worker is warmed up
    serving: SynchronizedArray[Any]  # ctypes c_byte per slot: its worker counts for /ready (the supervisor's)
    memory: SynchronizedArray[Any]  # ctypes c_longlong per slot: its worker's bytes, as last measured
    metrics_dir: str
    models: int = 1  # each with its own admission budget

    @classmethod
    def create(cls, ctx: Any, slots: int, serving: int, metrics_dir: str, models: int = 1) -> Shared:
        """``slots`` slots from multiprocessing context ``ctx``, of which the first ``serving`` serve, for a
        service of ``models`` models."""
        shared = cls(
            ctx.Array("q", slots * models),
            ctx.Array("b", slots),
            ctx.Array("b", slots),
            ctx.Array("q", slots),
            metrics_dir,
            models,
        )
        shared.serving[:serving] = [1] * serving
        return shared


class SharedLedger:
    """Admission permits of every worker, counted per worker in shared memory (see module docstring); with
    several models, one ledger per model (its budget), over every worker."""

    def __init__(self, permits: SynchronizedArray[Any], index: int, model: int = 0, models: int = 1) -> None:
        self._permits = permits
        self._index = index * models + model
        self._model = model
        self._models = models

    def _in_use(self) -> int:
        return int(sum(self._permits[self._model :: self._models]))

    def try_take(self, count: int, limit: int) -> bool:
        with self._permits.get_lock():
            if self._in_use() + count > limit:
                return False
            self._permits[self._index] += count
            return True

    def give_back(self, count: int) -> int:
        with self._permits.get_lock():
            self._permits[self._index] -= count
            return int(self._permits[self._index])

    def total(self) -> int:
        return self._in_use()


class Cluster:
    """One worker's view of the server it belongs to.

    ``replacing``: why the supervisor started this worker in place of another (``"memory"``, ``"crash"``),
    None for one of the first.
    """

    def __init__(self, shared: Shared, index: int, replacing: str | None = None) -> None:
        self.shared = shared
        self.index = index
        self.replacing = replacing
        self.ledger = self.ledger_for(0)

    def ledger_for(self, model: int) -> SharedLedger:
        """The admission ledger of the ``model``-th model (in the order of ``settings.model_entries()``)."""
        return SharedLedger(self.shared.permits, self.index, model, self.shared.models)

    @property
    def size(self) -> int:
        """The workers serving (a starting replacement and a retiring worker do not count)."""
        return sum(self.shared.serving[:])

    def set_ready(self, ready: bool) -> None:
        self.shared.ready[self.index] = int(ready)

    def ready_count(self) -> int:
        """The serving workers that are ready."""
        return sum(1 for r, s in zip(self.shared.ready[:], self.shared.serving[:], strict=True) if r and s)

    def all_ready(self) -> bool:
        # Serving flags before ready flags: the supervisor marks a replacement serving only once it is
        # ready and unmarks the worker it replaces after that, so every slot read as serving is ready.
        serving = self.shared.serving[:]
        ready = self.shared.ready[:]
        return all(r for r, s in zip(ready, serving, strict=True) if s)

    def memory_bytes(self) -> int:
        """This worker's memory as the supervisor last measured it (0 before its first measurement)."""
        return int(self.shared.memory[self.index])
