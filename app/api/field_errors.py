"""A pydantic validation error in the service's words: the field as the client wrote it (``inputs[3]``),
what it must be, and what was sent. :func:`app.api.errors.validation_message` joins them into one message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from app.api.schemas.common import UNION_TAGS
from app.errors import json_kind

# Parts of a pydantic error location that name a type tried in a union, not a field (pydantic's own,
# and the schemas' tags; no request field has one of these names).
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "tuple", "body"}) | UNION_TAGS


# The most characters of a sent value an error message repeats.
_SHOWN_CHARS = 80


def _shown(given: Any) -> str:
    """``given`` as the client sent it, in JSON, cut to :data:`_SHOWN_CHARS`: orjson's, or the standard
    library's for what orjson cannot write (an integer past 64 bits, which the standard parser reads)."""
    try:
        text = orjson.dumps(given).decode()
    except TypeError:
        text = json.dumps(given, ensure_ascii=False)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


# pydantic's type errors, as what the field must be.
_MUST_BE: dict[str, str] = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}

# pydantic's wording, and ours.
_REWORDED = (
    ("Value error, ", ""),
    ("Assertion failed, ", ""),
    ("Input should be", "must be"),
    ("List should have", "must have"),
    ("String should have", "must have"),
)


def _reworded(message: str) -> str:
    for old, new in _REWORDED:
        message = message.replace(old, new)
    return message


def field_path(loc: Sequence[Any]) -> str:
    """An error location as the client wrote the field: ``inputs[3]``, ``inputs.sentences[0]``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)):
            path += f".{part}" if path else str(part)
    return path


def field_message(err: Any) -> str:
    """One pydantic error as ``<field> <what it must be>``, in the service's words."""
    path = field_path(err.get("loc", ()))
    kind = err.get("type", "")
    given = err.get("input")
    if kind in _MUST_BE:
        what = f"must be {_MUST_BE[kind]}, not {json_kind(given)}"
    elif kind == "missing":
        what = "is required"
    elif kind == "literal_error":
        what = f"must be one of {err.get('ctx', {}).get('expected', '?')}, not {_shown(given)}"
    elif kind.endswith("_type"):  # the schemas' own forms (inputs_type, …) and pydantic's other types
        what = f"{_reworded(str(err.get('msg', 'is invalid')))}, not {json_kind(given)}"
    else:
        what = _reworded(str(err.get("msg", "is invalid")))
        if isinstance(given, int | float) and not isinstance(given, bool) and "must" in what:
            what += f", not {given}"
    return f"{path} {what}" if path else what
