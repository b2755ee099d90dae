"""Schemathesis over every operation of the live server's OpenAPI document: valid and invalid bodies
(fuzzing), boundary values and undocumented methods (its coverage phase). No response is a 5xx, none
outlasts the client timeout, each matches its documented status codes, content type and schema, an
undocumented method is a 405 with ``Allow``, and after each operation the server is healthy with every
permit back (conftest.py).

The schema is loaded here, at import, from the app itself: schemathesis's loader from a fixture
(``schemathesis.pytest.from_fixture``) fails on pytest 9 (it sets ``Function._nodeid``, gone there)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from app.serving.factory import create_app
from app.settings import Settings
from tests.app.api.rpc.grpc_process import Server
from tests.app.property.conftest import CALL_TIMEOUT_S, DEEP, EXAMPLES, SERVED

pytestmark = pytest.mark.property

# The OpenAPI document as the app builds it, before any model is loaded (its routes and schemas do not
# depend on the model; test_the_served_document_is_the_one_tested checks it against the live one).
DOCUMENT = create_app(Settings(model="unused")).openapi()


def aimed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with each request's ``model`` (and /v1/models/{model}) one the live server serves, or
    none: generated names would be 404s that never reach a model. Negative examples still send others."""
    aimed = copy.deepcopy(document)
    served = {"enum": list(SERVED)}
    for name, definition in aimed["components"]["schemas"].items():
        if name.endswith("Request") and "model" in definition.get("properties", {}):
            definition["properties"]["model"] = {"anyOf": [served, {"type": "null"}]}
    for parameter in aimed["paths"]["/v1/models/{model}"]["get"]["parameters"]:
        parameter["schema"] = served
    return aimed


schema = schemathesis.openapi.from_dict(
    aimed(DOCUMENT),
    config=schemathesis.Config.from_dict(
        {
            "generation": {"max-examples": EXAMPLES, "deterministic": not DEEP, "mode": "all"},
            "phases": {"coverage": {"enabled": True}},
        }
    ),
)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    unsupported_method,
]


def test_the_served_document_is_the_one_tested(live: Server) -> None:
    assert httpx.get(live.url + "/openapi.json", timeout=CALL_TIMEOUT_S).json() == DOCUMENT


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx_or_stalls(case: schemathesis.Case, live: Server) -> None:
    case.call_and_validate(base_url=live.url, timeout=CALL_TIMEOUT_S, checks=CHECKS)
