"""Whether a checkpoint was trained for shorter vectors (Matryoshka representation learning), and at which
widths: as vLLM reads it from config.json (``matryoshka_dimensions``, else ``is_matryoshka``), or as
``--matryoshka-dimensions`` declares it for a checkpoint whose config does not say (sentence-transformers'
MatryoshkaLoss leaves no trace there). The manifest records it (``defaults.matryoshka`` and
``defaults.matryoshka_dimensions``); the service lets a request's ``dimensions`` cut only such a model's
vectors (:func:`app.tasks.options.check_dimensions`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal

from export.source import ExportError

# Trained for every width up to its own: config.json's is_matryoshka, or --matryoshka-dimensions any.
ANY_WIDTH: Final = "any"
# The widths it was trained for, any width, or not trained for shorter vectors (None).
Declared = tuple[int, ...] | Literal["any"] | None


def declared(folder: Path) -> Declared:
    """What ``folder``'s config.json says, as vLLM reads it: ``matryoshka_dimensions`` (a non-empty list:
    those widths), else ``is_matryoshka`` true (any width); None when neither.

    Raises:
        ExportError: either key holds something other than what vLLM reads there.
    """
    path = folder / "config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    listed = raw.get("matryoshka_dimensions")
    flag = raw.get("is_matryoshka", False)
    if listed is not None and not (
        isinstance(listed, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in listed)
    ):
        raise ExportError(f"{path}: matryoshka_dimensions must be a list of integers, not {listed!r}")
    if not isinstance(flag, bool):
        raise ExportError(f"{path}: is_matryoshka must be true or false, not {flag!r}")
    if listed:
        return tuple(listed)
    return ANY_WIDTH if flag else None


def as_flag(declaration: tuple[int, ...] | str) -> str:
    """As ``--matryoshka-dimensions`` takes it: "any" or a comma list (what the manifest's options keep,
    for the command that exports the folder again)."""
    return declaration if isinstance(declaration, str) else ",".join(str(d) for d in declaration)


def recorded(declaration: Declared) -> tuple[bool, list[int] | None]:
    """The manifest's ``defaults.matryoshka`` and ``matryoshka_dimensions`` (widest first) for it."""
    if declaration is None:
        return False, None
    if isinstance(declaration, str):  # ANY_WIDTH
        return True, None
    return True, sorted(set(declaration), reverse=True)


def checked(declaration: Declared, width: int) -> tuple[bool, list[int] | None]:
    """:func:`recorded`, each width checked against the model's vectors (``width``: the hidden size, or
    the last Dense module's output).

    Raises:
        ExportError: a width below 1 or over ``width``.
    """
    trained, listed = recorded(declaration)
    if listed is not None and (bad := [d for d in listed if not 1 <= d <= width]):
        raise ExportError(
            f"matryoshka dimensions {bad} do not fit this model's vectors of {width} dimensions: each must "
            f"be 1..{width}"
        )
    return trained, listed
