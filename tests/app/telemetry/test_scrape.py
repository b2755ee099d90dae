"""The scrape of several workers' files: what prometheus-client's own collector fails on is left out."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from app.telemetry.metrics import Metrics
from app.telemetry.scrape import WrittenFiles


def test_a_scrape_of_several_workers_skips_a_file_a_worker_has_not_yet_sized(tmp_path: Path) -> None:
    # One worker's counter as prometheus-client writes it, and another's files at the moment they exist
    # unsized (prometheus/client_python#1199): the scrape reads the first and leaves the others out.
    written = MmapedDict(str(tmp_path / "counter_101.db"))
    key = json.dumps(["zhembed_failures", "zhembed_failures_total", {"model": "", "reason": "x"}, "h"])
    written.write_value(key, 3.0, 0.0)
    written.close()
    (tmp_path / "counter_102.db").touch()
    (tmp_path / "gauge_livesum_102.db").touch()
    text = Metrics(multiprocess_dir=str(tmp_path)).exposition().decode()
    assert 'zhembed_failures_total{model="",reason="x"} 3.0' in text
    assert generate_latest_of(WrittenFiles, tmp_path).decode() == text
    with pytest.raises(struct.error):  # what the library's own collector still does
        generate_latest_of(MultiProcessCollector, tmp_path)


def generate_latest_of(collector: type[MultiProcessCollector], path: Path) -> bytes:
    registry = CollectorRegistry()
    collector(registry, path=str(path))
    return generate_latest(registry)
