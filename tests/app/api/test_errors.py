"""Every row of the error table, through a real server; no odd input produces a 500; validation
messages in the service's words."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest

from app.api.errors import ERROR_TABLE, RETRY_AFTER_S, error_parts, validation_message
from app.api.field_errors import field_path
from app.errors import InternalError
from tests.app.conftest import Running


def test_table_rows_are_distinct_and_shaped() -> None:
    types = [row.error_type for row in ERROR_TABLE.values()]
    assert len(types) == len(set(types))
    assert {row.status for row in ERROR_TABLE.values()} >= {400, 413, 422, 429, 503}


def assert_error(response: httpx.Response, status: int, error_type: str, *words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}
    assert body["error_type"] == error_type
    for word in words:
        assert word in body["error"]


@pytest.mark.parametrize("inputs", [[], "", ["ok", ""]])
def test_400_empty_input(client: httpx.Client, inputs: object) -> None:
    assert_error(client.post("/embed", json={"inputs": inputs}), 400, "empty")


def test_400_fill_mask_without_mlm_head(client: httpx.Client, server: Running) -> None:
    model = server.service.model
    head, model._mlm = model._mlm, None
    try:
        assert_error(client.post("/fill-mask", json={"inputs": "我[MASK]你"}), 400, "unsupported", "head")
    finally:
        model._mlm = head


def test_404_and_405(client: httpx.Client) -> None:
    assert_error(client.get("/nope"), 404, "not_found")
    assert_error(client.get("/embed"), 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/embed", {"inputs": ["a"] * 65}, ["65 inputs", "64"]),
        ("/embed", {"inputs": "字" * 8193}, ["8193 characters", "8192"]),
        ("/embed", {"inputs": "字" * 200}, ["202 tokens", "128"]),
        ("/embed", {"inputs": "a", "layers": [0]}, ["layer 0"]),
        ("/embed", {"inputs": "a", "layers": [4]}, ["layer 4"]),
        ("/embed", {"inputs": "a", "layers": [-4]}, ["layer -4"]),
        ("/embed", {"inputs": "a", "layers": []}, ["layers"]),
        ("/embed", {"inputs": "a", "pooling": "pooler", "layers": [1]}, ["pooler"]),
        ("/embed", {"inputs": "a", "pooling": "median"}, ["pooling"]),
        ("/embed", {"inputs": 3}, ["inputs"]),
        ("/embed", {"inputs": ["a", None]}, ["inputs"]),
        ("/embed", {"inputs": "a", "normalize": "yes"}, ["normalize"]),
        ("/embed", {"inputs": "a", "encoding": "fp16"}, ["encoding"]),
        ("/embed", {}, ["inputs"]),
        ("/fill-mask", {"inputs": "没有面具"}, ["no [MASK]"]),
        ("/fill-mask", {"inputs": "我[MASK]你", "top_k": 0}, ["top_k"]),
        ("/fill-mask", {"inputs": "我[MASK]你", "top_k": 51}, ["top_k"]),
        ("/similarity", {"inputs": {"source_sentence": "a"}}, ["sentences"]),
        ("/similarity", {"pairs": [["a"]]}, ["pairs"]),
        ("/similarity", {"pairs": [["a", "b"]], "inputs": {"source_sentence": "a", "sentences": ["b"]}}, []),
    ],
)
def test_422_validation(client: httpx.Client, path: str, body: object, words: list[str]) -> None:
    assert_error(client.post(path, json=body), 422, "validation", *words)


@pytest.mark.parametrize("raw", [b"{", b"[" * 50_000, b"\xff\xfe", b'{"inputs": "a",'])
def test_400_for_unreadable_bodies(client: httpx.Client, raw: bytes) -> None:
    response = client.post("/embed", content=raw, headers={"content-type": "application/json"})
    assert_error(response, 400, "malformed")


@pytest.mark.parametrize("raw", [b'{"inputs": "\\ud800"}', b"null", b"[]"])
def test_422_for_bodies_that_read_but_do_not_fit(client: httpx.Client, raw: bytes) -> None:
    response = client.post("/embed", content=raw, headers={"content-type": "application/json"})
    assert_error(response, 422, "validation")


def test_413_body_over_the_limit(client: httpx.Client, server: Running) -> None:
    limit = server.service.settings.max_body_bytes
    response = client.post("/embed", json={"inputs": "a" * (limit + 1)})
    assert_error(response, 413, "payload_too_large", str(limit))


def test_429_when_no_permits_are_left(client: httpx.Client, server: Running) -> None:
    admission = server.service.engine.admission
    held = admission.try_acquire(admission.limit - 1)
    try:
        response = client.post("/embed", json={"inputs": ["a", "b"]})
        assert_error(response, 429, "overloaded")
        assert response.headers["retry-after"] == str(RETRY_AFTER_S)
        assert client.post("/embed", json={"inputs": ["a"]}).status_code == 200  # one permit left
    finally:
        held.release()
    assert admission.in_use == 0


def test_503_until_ready(client: httpx.Client, server: Running) -> None:
    server.service.ready = False
    try:
        assert_error(client.get("/ready"), 503, "unhealthy")
        assert_error(client.post("/embed", json={"inputs": "a"}), 503, "unhealthy")
        assert client.get("/health").status_code == 200
    finally:
        server.service.ready = True


ODD = [
    "\x00",
    " ",
    "\n\t",
    "🙂" * 50,
    "[MASK]",
    "[CLS][SEP][PAD]",
    "ا\u200fلعربية",
    "e\u0301" * 30,
    "\U0010ffff",
    "##",
]


@pytest.mark.parametrize("path", ["/embed", "/similarity", "/fill-mask", "/tokenize"])
def test_odd_inputs_never_give_a_500(client: httpx.Client, path: str) -> None:
    for text in ODD:
        body: dict[str, object] = {"inputs": text}
        if path == "/similarity":
            body = {"inputs": {"source_sentence": text, "sentences": ODD}}
        response = client.post(path, json=body)
        assert response.status_code < 500, (text, response.text)


def test_openapi_lists_the_error_rows(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/embed", "/similarity", "/fill-mask"):
        listed = set(spec["paths"][path]["post"]["responses"])
        assert {"400", "413", "422", "429", "503"} <= listed


def test_openai_routes_answer_errors_in_openai_shape_from_the_same_table(client: httpx.Client) -> None:
    assert {row.openai_type for row in ERROR_TABLE.values()} <= {
        "invalid_request_error",
        "authentication_error",
        "rate_limit_error",
        "server_error",
    }
    too_big = client.post(
        "/v1/embeddings", content=b"[" * (2 * 1024 * 1024 + 1), headers={"content-type": "application/json"}
    )
    assert too_big.status_code == 413
    assert too_big.json() == {
        "error": {
            "message": "request body is larger than the limit of 2097152 bytes",
            "type": "invalid_request_error",
            "code": "payload_too_large",
        }
    }


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("body", "inputs", "list", 3), "inputs[3]"),
        (("body", "inputs", "similarity", "sentences", 0), "inputs.sentences[0]"),
        (("body", "pairs", 1, 0), "pairs[1][0]"),
        (("body", "layers", 0), "layers[0]"),
        (("body", "input", "id_lists", 2, 5), "input[2][5]"),
        (("body", "parameters", "top_k"), "parameters.top_k"),
    ],
)
def test_an_error_names_the_field_as_the_client_wrote_it(loc: tuple[object, ...], path: str) -> None:
    assert field_path(loc) == path


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            {"type": "string_type", "loc": ("body", "inputs", "list", 1), "input": 7},
            "inputs[1] must be a string, not a number",
        ),
        (
            {"type": "bool_type", "loc": ("body", "normalize"), "input": "yes"},
            "normalize must be true or false, not a string",
        ),
        ({"type": "missing", "loc": ("body", "inputs"), "input": {}}, "inputs is required"),
        (
            {
                "type": "literal_error",
                "loc": ("body", "encoding"),
                "input": "fp16",
                "ctx": {"expected": "'float', 'base64' or 'int8'"},
            },
            "encoding must be one of 'float', 'base64' or 'int8', not \"fp16\"",
        ),
        (
            {
                "type": "less_than_equal",
                "loc": ("body", "top_k"),
                "input": 51,
                "msg": "Input should be less than or equal to 50",
            },
            "top_k must be less than or equal to 50, not 51",
        ),
        (
            {
                "type": "value_error",
                "loc": ("body",),
                "input": {},
                "msg": "Value error, give exactly one of a or b",
            },
            "give exactly one of a or b",
        ),
    ],
)
def test_validation_messages_are_in_the_services_words(error: dict[str, object], message: str) -> None:
    assert validation_message([error]) == message


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings"])
def test_a_server_fault_tells_an_error_id_in_either_shape_and_logs_the_text_once(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    fault = InternalError("node /encoder/Gather_3: index 600 out of [-512, 511] in /srv/models/x.onnx")
    scope: dict[str, Any] = {"path": path}
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        for _ in range(2):  # e.g. two requests of one failed batch: one error, logged once
            status, body, headers = error_parts(fault, scope)
    answered = orjson.loads(body)
    detail = answered["error"] if path.startswith("/v1/") else answered
    message = detail["message"] if path.startswith("/v1/") else detail["error"]
    assert status == 500 and detail["error_id"] == fault.error_id == dict(headers)[b"x-error-id"].decode()
    assert fault.error_id in message and "Gather" not in body.decode() and "/srv" not in body.decode()
    (record,) = [r for r in caplog.records if fault.error_id in r.getMessage()]
    assert "Gather_3" in record.getMessage() and record.fields == {"error_id": fault.error_id}  # type: ignore[attr-defined]
