"""The benchmark harness: what every benchmark of ``loadtest/`` builds on, so that each benchmark module is
only what it measures.

- :mod:`.cell`: what a cell sends (clients × texts, route, protocol, urgency, encoding) and its distinct
  request bodies;
- :mod:`.service`: the service's settings, built from :class:`app.settings.Settings` (one GPU-like preset),
  as environment variables for ``python -m app`` or as the service itself, in-process;
- :mod:`.measure`: one measured cell: /metrics and the server's CPU right before and right after the load;
- :mod:`.report`: one row type for every table, PASS / MISS targets, and the JSON report.

The load generator is :mod:`loadtest.loadgen`, the raw ceiling :func:`loadtest.raw_onnx.ceiling`, the tiny
model of the ``--quick`` runs :mod:`loadtest.quick_model`.
"""
