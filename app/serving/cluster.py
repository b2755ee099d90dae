"""What the worker processes of one server share: their admission permits, ready flags and metrics
directory, in shared memory (the supervisor that starts them is :mod:`app.serving.supervisor`), and how many
workers to run.

What holds with N > 1, as with one process:

- **429 before queueing**, against ONE budget: the permits in use are counted per worker in shared memory
  (:class:`SharedLedger`) and a request is refused only when the server's total would pass
  ``max_concurrent_inputs``. A worker that dies has its count cleared when it is replaced.
- **/metrics shows every worker in one scrape**: prometheus-client's multiprocess mode (each worker
  writes its samples to files in a directory of the supervisor's; whichever worker answers the scrape
  reads them all).
- **/ready is true only when every worker is ready** (a flag per worker in shared memory).
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
    """What the workers of one server share: their permit counts, ready flags and metrics directory."""

    permits: SynchronizedArray[Any]  # ctypes c_longlong per worker
    ready: SynchronizedArray[Any]  # ctypes c_byte per worker
    metrics_dir: str


class SharedLedger:
    """Admission permits of every worker, counted per worker in shared memory (see module docstring)."""

    def __init__(self, permits: SynchronizedArray[Any], index: int) -> None:
        self._permits = permits
        self._index = index

    def try_take(self, count: int, limit: int) -> bool:
        with self._permits.get_lock():
            if sum(self._permits[:]) + count > limit:
                return False
            self._permits[self._index] += count
            return True

    def give_back(self, count: int) -> int:
        with self._permits.get_lock():
            self._permits[self._index] -= count
            return int(self._permits[self._index])

    def total(self) -> int:
        return int(sum(self._permits[:]))


class Cluster:
    """One worker's view of the server it belongs to."""

    def __init__(self, shared: Shared, index: int) -> None:
        self.shared = shared
        self.index = index
        self.size = len(shared.ready)
        self.ledger = SharedLedger(shared.permits, index)

    def set_ready(self, ready: bool) -> None:
        self.shared.ready[self.index] = int(ready)

    def ready_count(self) -> int:
        return sum(self.shared.ready[:])

    def all_ready(self) -> bool:
        return self.ready_count() == self.size
