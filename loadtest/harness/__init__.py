"""The benchmark harness every benchmark of ``loadtest/`` builds on: :mod:`.cell` (what a cell sends),
:mod:`.service` (the service's settings from :class:`app.settings.Settings`), :mod:`.measure` (one
measured cell) and :mod:`.report` (one row type, its targets, the JSON report). The load generator is
:mod:`loadtest.loadgen`, the raw ceiling :func:`loadtest.raw_onnx.ceiling`.
"""
