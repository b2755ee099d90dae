"""loadtest.harness.service: a benchmark's settings are the service's own, by name and by value."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings
from loadtest.harness.service import GPU_LIKE, fields, service_env


def test_the_environment_names_each_setting_with_the_service_prefix() -> None:
    env = service_env(Path("m"), "int8", 4096, intra_op_threads=1, grpc_port=None)
    assert env == {
        "ZHEMBED_MODEL": "m",
        "ZHEMBED_VARIANT": "int8",
        "ZHEMBED_LOG_LEVEL": "warning",
        "ZHEMBED_CACHE_BYTES": "0",
        "ZHEMBED_MAX_CONCURRENT_INPUTS": "4096",
        "ZHEMBED_INTRA_OP_THREADS": "1",
    }
    assert service_env(Path("m"), "int8", 8)["ZHEMBED_MAX_CONCURRENT_INPUTS"] == "512"  # never below 512
    assert service_env(Path("m"), "int8", 8, cache_bytes=64)["ZHEMBED_CACHE_BYTES"] == "64"


def test_the_gpu_like_preset_is_valid_settings_and_a_misspelt_one_is_refused() -> None:
    settings = Settings(**fields(Path("m"), "fp16", 0, **GPU_LIKE))
    assert (settings.max_batch_size, settings.max_batch_tokens) == (256, 32768)
    with pytest.raises(ValueError, match="max_batch_token"):
        fields(Path("m"), "fp32", 0, max_batch_token=1)
