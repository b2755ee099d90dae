"""The application factory's start-up: what a warm app leaves behind."""

from __future__ import annotations

import gc

from app.serving.factory import GC_YOUNG_THRESHOLD
from tests.app.conftest import Running


def test_a_warm_app_keeps_the_collector_off_its_start_up_objects(server: Running) -> None:
    assert server.service.ready
    assert gc.get_freeze_count() > 0  # the model, the app and their modules: never scanned again
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
