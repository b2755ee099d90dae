"""A bounded schemathesis run against the live test server's ``/openapi.json``: requests generated from
the schema (valid and invalid) never get a 5xx, and every response matches the documented status codes,
content types and schemas.

Bounded in examples per operation (not in time: a time budget would test less on a slower machine), so it
fits CI; deterministic generation makes a failure reproducible. schemathesis is a dev dependency; without it the test skips.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.app.conftest import Running

pytest.importorskip("schemathesis")

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    ]
)


@pytest.mark.slow
def test_schema_driven_requests_never_5xx_and_match_the_schema(server: Running) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from schemathesis.cli import schemathesis; schemathesis()",
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            "10",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--generation-deterministic",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Test cases:" in done.stdout and " passed" in done.stdout, done.stdout[-4000:]
