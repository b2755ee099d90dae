"""The benchmark harness every benchmark of ``loadtest/`` builds on: :mod:`.cell` (what a cell sends),
:mod:`.service` (the service's settings from :class:`app.settings.Settings`), :mod:`.measure` (one
measured cell), :mod:`.report` (one row type, its targets, the JSON report) and :func:`parser` (a command
line). The load generator is :mod:`loadtest.loadgen`, the raw ceiling :func:`loadtest.raw_onnx.ceiling`.
"""

import argparse


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """``python -m module``'s parser; ``doc``, its usage lines and what it prints, is the help as written."""
    raw = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(f"python -m {module}", description=doc, formatter_class=raw)
