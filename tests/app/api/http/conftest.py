"""Servers the HTTP tests of several modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.model.runtime import load_model
from app.settings import Settings
from tests.app.conftest import Running, serving


@pytest.fixture(scope="module")
def two(tiny_model_dir: Path, tiny_reranker_dir: Path) -> Iterator[Running]:
    """An embedder (the default of the embedding routes) and a cross-encoder (of the rerank routes)."""
    settings = Settings(
        models=f"embed={tiny_model_dir},rerank={tiny_reranker_dir}",
        variant="fp32",
        intra_op_threads=1,
        max_wait_ms=2,
        cache_bytes=0,
        max_inputs_per_request=128,
    )
    loaded = [load_model(own) for _, own in settings.model_entries()]
    with serving(settings, models=loaded) as running:
        yield running
