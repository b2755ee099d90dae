"""Tracing as the standard OpenTelemetry variables ask: ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``_PROTOCOL`` (``grpc`` or ``http/protobuf``), ``_HEADERS``, ``_INSECURE``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``_ARG``, ``OTEL_TRACES_EXPORTER`` and
``OTEL_SDK_DISABLED``; off unless an endpoint is named."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)

from app.telemetry.tracing import Tracing

PROTOCOLS = ("grpc", "http/protobuf")
_FIXED_SAMPLERS: dict[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF,
}
_RATIO_SAMPLERS: dict[str, type[Sampler]] = {
    "traceidratio": TraceIdRatioBased,
    "parentbased_traceidratio": ParentBasedTraceIdRatio,
}


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _setting(env: Mapping[str, str], name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``, else ''."""
    return (
        env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or ""
    ).strip()


def _sampler(env: Mapping[str, str]) -> Sampler:
    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if name in _FIXED_SAMPLERS:
        return _FIXED_SAMPLERS[name]
    if name not in _RATIO_SAMPLERS:
        known = ", ".join([*_FIXED_SAMPLERS, *_RATIO_SAMPLERS])
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r} is not supported (one of: {known})")
    arg = (env.get("OTEL_TRACES_SAMPLER_ARG") or "1.0").strip()
    try:
        rate = float(arg)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
    return _RATIO_SAMPLERS[name](rate)  # type: ignore[call-arg]


def _resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``key=value`` pairs, comma separated, percent-encoded."""
    pairs = {}
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _headers(env: Mapping[str, str]) -> dict[str, str]:
    pairs = {}
    for item in _setting(env, "HEADERS").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip()).lower()] = unquote(value.strip())
    return pairs


def _exporter(env: Mapping[str, str], protocol: str, timeout_s: float) -> SpanExporter:
    traces_endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    endpoint = traces_endpoint or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    headers = _headers(env)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        insecure = _setting(env, "INSECURE")
        return GrpcExporter(
            endpoint=endpoint,
            insecure=_true(insecure) if insecure else None,
            headers=headers or None,
            timeout=timeout_s,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    if not traces_endpoint:  # the base endpoint gets the signal's path
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint, headers=headers or None, timeout=timeout_s)


def from_environment(
    env: Mapping[str, str] | None = None,
    default_service_name: str = "zhembed",
    *,
    max_queue_size: int = 2048,
    max_export_batch_size: int = 512,
    schedule_delay_ms: float = 500.0,
    export_timeout_s: float = 2.0,
) -> Tracing:
    """Tracing as the standard OpenTelemetry variables in ``env`` (default: the process's) ask.

    On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, unless
    ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``. Raises ValueError on a protocol,
    exporter or sampler it does not support.
    """
    env = os.environ if env is None else env
    if _true(env.get("OTEL_SDK_DISABLED")):
        return Tracing()
    exporters = {e.strip().lower() for e in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")} - {""}
    if "none" in exporters:
        return Tracing()
    if exporters - {"otlp"}:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER')!r} is not supported (otlp or none)"
        )
    if not (
        (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
        or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    ):
        return Tracing()
    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not (env.get(variable) or "").strip():
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = (_setting(env, "PROTOCOL") or "grpc").lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"{variable}={protocol!r} is not supported (grpc or http/protobuf)")
    sampler = _sampler(env)
    return Tracing(
        _exporter(env, protocol, export_timeout_s),
        service_name=(env.get("OTEL_SERVICE_NAME") or "").strip() or default_service_name,
        resource_attributes=_resource_attributes(env),
        sampler=sampler,
        max_queue_size=max_queue_size,
        max_export_batch_size=max_export_batch_size,
        schedule_delay_ms=schedule_delay_ms,
        export_timeout_s=export_timeout_s,
    )
