"""Logs as one JSON object per line (``--log-format json``), and the one line each request writes.

The request line carries only what a request measured (route, status, counts, timings, trace id): it has
no parameter for a text, a header or a key, so none can reach the log through it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.telemetry.context import CURRENT_MODEL
from app.telemetry.timings import Timings

try:
    import orjson

    def _dumps(value: dict[str, Any]) -> str:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()

except ImportError:  # pragma: no cover - orjson is a dependency
    import json

    def _dumps(value: dict[str, Any]) -> str:
        return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CORE = ("ts", "level", "logger", "message")


class JsonFormatter(logging.Formatter):
    """One JSON object a record: ``ts`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, each key of
    ``extra={"fields": {...}}`` and of ``static`` (e.g. a worker index), and ``exc`` for an exception."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for extra in (self.static, getattr(record, "fields", None)):
            if isinstance(extra, Mapping):
                for key, value in extra.items():
                    if key not in _CORE:
                        line[str(key)] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _dumps(line)


def request_line(
    logger: logging.Logger,
    *,
    protocol: str,
    route: str,
    status: int | str,
    inputs: int,
    tokens: int,
    timings: Timings | None,
    trace_id: str | None,
    error_type: str | None = None,
) -> None:
    """Log the one INFO line of a finished request (route is the route's template, never the raw path),
    with the model that served it where one was chosen (:data:`app.telemetry.context.CURRENT_MODEL`)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {
        "protocol": protocol,
        "route": route,
        "status": status,
        "inputs": inputs,
        "tokens": tokens,
    }
    if model := CURRENT_MODEL.get():
        fields["model"] = model
    total_ms = 0.0
    if timings is not None:
        total_ms = timings.total_ms
        fields["queue_ms"] = timings.queue_ms
        fields["tokenization_ms"] = timings.tokenization_ms
        fields["inference_ms"] = timings.inference_ms
        fields["total_ms"] = timings.total_ms
    fields["trace_id"] = trace_id
    if error_type is not None:
        fields["error_type"] = error_type
    logger.info(
        "%s %s %s inputs=%d tokens=%d total_ms=%.1f",
        protocol,
        route,
        status,
        inputs,
        tokens,
        total_ms,
        extra={"fields": fields},
    )


def _stderr_handler(root: logging.Logger) -> logging.Handler:
    """The root logger's StreamHandler to stderr (the one ``logging.basicConfig`` adds), added if missing."""
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.__stderr__):
            return handler
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    return handler


def configure(
    format: str,
    level: str = "INFO",
    *,
    text_format: str = TEXT_FORMAT,
    static: Mapping[str, Any] | None = None,
) -> None:
    """Set the root logger's level and its stderr handler's format: ``json`` lines or plain ``text``."""
    if format not in FORMATS:
        raise ValueError(f"log format {format!r} is not supported (text or json)")
    root = logging.getLogger()
    root.setLevel(level.upper())
    handler = _stderr_handler(root)
    if format == "json":
        handler.setFormatter(JsonFormatter(static))
    else:
        handler.setFormatter(logging.Formatter(text_format))
