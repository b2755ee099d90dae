"""How the service is watched: Prometheus metrics under one prefix (:mod:`~app.telemetry.metrics`),
OpenTelemetry traces (:mod:`~app.telemetry.tracing`, configured by :mod:`~app.telemetry.otel_config`,
exported by :mod:`~app.telemetry.export`), JSON logs (:mod:`~app.telemetry.logs`), each request's span
and log line (:mod:`~app.telemetry.observe`), and the stage timings they are made from
(:mod:`~app.telemetry.timings`). Imports nothing of what serves a request."""
