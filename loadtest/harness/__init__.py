"""The benchmark harness every benchmark of ``loadtest/`` builds on: :mod:`.cell` (what a cell sends),
:mod:`.service` (the service's settings from :class:`app.settings.Settings`), :mod:`.measure` (one
measured cell), :mod:`.report` (one row type, its table's columns, its targets, the JSON report) and
:func:`parser` (a command line). The load generator is :mod:`loadtest.loadgen`, the raw ceiling
:func:`loadtest.raw_onnx.ceiling`.
"""

import argparse
from pathlib import Path
from typing import Any

# The default model of the benchmarks that need a real-size one: bert-base-chinese's shape twin (make_twin).
TWIN = Path("models/bert-base-chinese-twin")

# The arguments benchmarks share: each one's type and help.
COMMON: dict[str, tuple[type, str]] = {
    "model": (
        Path,
        "export folder; where the default is none, the tiny model's (exported into it or a temp dir)",
    ),
    "duration": (float, "measured seconds per cell"),
    "seconds": (float, "measured seconds per cell"),
    "warmup": (float, "unmeasured seconds before each cell"),
    "out": (Path, "JSON path (default: a new file in loadtest/results/)"),
}


def parser(module: str, doc: str | None, quick: str = "", **common: Any) -> argparse.ArgumentParser:
    """``python -m module``'s parser; ``doc``, its usage lines and what it prints, is the help as written.
    Each of ``common`` is an argument of ``COMMON`` with its default; ``quick`` is ``--quick``'s help."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(f"python -m {module}", description=doc, formatter_class=raw)
    for name, default in common.items():
        kind, what = COMMON[name]
        p.add_argument(f"--{name}", type=kind, default=default, help=what)
    if quick:
        p.add_argument("--quick", action="store_true", help=quick)
    return p
