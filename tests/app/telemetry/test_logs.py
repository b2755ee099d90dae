"""app.telemetry.logs: JSON lines, the request line, and configure()."""

from __future__ import annotations

import inspect
import io
import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime

import pytest

from app.telemetry.logs import JsonFormatter, configure, request_line
from app.telemetry.timings import Timings


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.jsonlog")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    yield logger, stream
    logger.removeHandler(handler)
    logger.propagate = True


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_its_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.warning(
        "loaded %s", "模型", extra={"fields": {"workers": 2, "model": "bert", "message": "ignored"}}
    )
    (line,) = lines(stream)
    assert line["level"] == "WARNING"
    assert line["logger"] == "tests.jsonlog"
    assert line["message"] == "loaded 模型"
    assert line["workers"] == 2 and line["model"] == "bert"
    assert line["ts"].endswith("Z")
    assert datetime.fromisoformat(line["ts"]).utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert "exc" not in line


def test_an_exception_carries_exc(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    (line,) = lines(stream)
    assert line["level"] == "ERROR"
    assert "RuntimeError: boom" in line["exc"]
    assert line["exc"].startswith("Traceback")


def test_request_line_is_one_line_of_what_the_request_measured(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    timings = Timings(queue_ms=1.5, tokenization_ms=0.25, inference_ms=4.0, total_ms=6.5)
    request_line(
        logger,
        protocol="http",
        route="/embed",
        status=200,
        inputs=3,
        tokens=42,
        timings=timings,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )
    (line,) = lines(stream)
    assert line["level"] == "INFO"
    assert {key: line[key] for key in ("protocol", "route", "status", "inputs", "tokens", "trace_id")} == {
        "protocol": "http",
        "route": "/embed",
        "status": 200,
        "inputs": 3,
        "tokens": 42,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }
    assert (line["queue_ms"], line["tokenization_ms"], line["inference_ms"], line["total_ms"]) == (
        1.5,
        0.25,
        4.0,
        6.5,
    )
    assert "error_type" not in line

    request_line(
        logger,
        protocol="grpc",
        route="tei.v1.Embed/Embed",
        status="RESOURCE_EXHAUSTED",
        inputs=1,
        tokens=0,
        timings=None,
        trace_id=None,
        error_type="overloaded",
    )
    second = lines(stream)[1]
    assert second["status"] == "RESOURCE_EXHAUSTED" and second["error_type"] == "overloaded"
    assert second["trace_id"] is None and "queue_ms" not in second


def test_request_line_has_no_parameter_for_a_text_header_or_key() -> None:
    assert set(inspect.signature(request_line).parameters) == {
        "logger",
        "protocol",
        "route",
        "status",
        "inputs",
        "tokens",
        "timings",
        "trace_id",
        "error_type",
    }


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level restored afterwards."""
    logger = logging.getLogger()
    handlers, level = list(logger.handlers), logger.level
    formatters = [handler.formatter for handler in handlers]
    yield logger
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
    for handler, formatter in zip(handlers, formatters, strict=True):
        handler.setFormatter(formatter)
    logger.setLevel(level)


def test_configure_json_then_text_on_the_root_stderr_handler(
    root: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure("json", "debug", static={"worker": 1})
    configure("json", "debug", static={"worker": 1})  # once is enough: no second handler
    logging.getLogger("tests.configure").debug("hello", extra={"fields": {"n": 1}})
    (line,) = lines(stream)
    assert (line["message"], line["n"], line["worker"], line["level"]) == ("hello", 1, 1, "DEBUG")
    assert root.level == logging.DEBUG

    configure("text", "info")
    logging.getLogger("tests.configure").info("plain")
    assert stream.getvalue().splitlines()[-1].endswith("INFO tests.configure: plain")
    with pytest.raises(ValueError, match="log format 'xml'"):
        configure("xml")
