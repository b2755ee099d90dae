"""The scrape of a server with several workers: prometheus-client's multiprocess files, read safely."""

from __future__ import annotations

import glob
import os
from typing import Any

from prometheus_client.multiprocess import MultiProcessCollector


class WrittenFiles(MultiProcessCollector):
    """prometheus-client's collector, less the files a worker has created but not yet sized.

    A worker's file exists at 0 bytes for a moment before it is sized (``MmapedDict.__init__``); read
    then, it fails the whole scrape with ``struct.error``, and a worker killed in that moment leaves it
    so for good (prometheus/client_python#1199, unfixed in 0.26). A file once sized is never empty
    again, so one that is empty when listed holds nothing yet and is left out.
    """

    def collect(self) -> Any:
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _sized(f)]
        return self.merge(files, accumulate=True)


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:  # (a dead worker's live gauge, removed since the listing)
        return False
