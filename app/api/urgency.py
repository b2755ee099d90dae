"""A request's urgency as HTTP says it: RFC 9218's ``Priority`` header (over gRPC, the same string in the
metadata ``priority``), else the API key's default (``ZHEMBED_API_KEYS`` entries ``key:u=N``), else 3.

How the header is read, as the RFCs say:

- It is a Structured Fields Dictionary (RFC 8941 §3.2); several ``Priority`` lines are one field, joined
  with commas (RFC 9110 §5.3). A field that does not parse as a Dictionary is ignored whole (RFC 8941
  §4.2: "If parsing fails, … the entire field value MUST be ignored"): ``U=0``, ``u=0, @x``, a trailing
  comma, a 16-digit integer, a byte outside visible ASCII.
- Of its members only ``u`` is read (RFC 9218 §4.1: an Integer from 0 to 7). Unknown members (``i``
  among them), a ``u`` out of range, or of another type (a Decimal, a String, a Token, an Inner List, a
  bare ``u``, which is Boolean true) are ignored (RFC 9218 §4: "unknown priority parameters, priority
  parameters with out-of-range values, or values of unexpected types MUST be ignored"), as are the member's
  own parameters (``a=1;u=0`` sets no urgency). A key given twice: the last one counts (RFC 8941 §4.2.2).
- Where that leaves no urgency, the API key's default applies, and without one RFC 9218's default, 3.

:func:`header_urgency` is the one parser of the field; :func:`urgency` adds the key's default. The HTTP
gates (:meth:`app.api.http.gates.Gates.admit`) and gRPC calls (:mod:`app.api.rpc.calls`) call :func:`urgency`
once per request and set the result in the request's task as :data:`app.engine.priority.URGENCY`, which the engine
reads and the request counters count by.
"""

from __future__ import annotations

import string
from functools import lru_cache

from app.engine.priority import DEFAULT_URGENCY


class _Invalid(ValueError):
    """The field does not parse as a Structured Fields Dictionary."""


_LCALPHA = frozenset(string.ascii_lowercase)
_KEY_FIRST = _LCALPHA | {"*"}
_KEY = _LCALPHA | frozenset(string.digits) | frozenset("_-.*")
_ALPHA = frozenset(string.ascii_letters)
_DIGITS = frozenset(string.digits)
_TCHAR = _ALPHA | _DIGITS | frozenset("!#$%&'*+-.^_`|~")
_TOKEN = _TCHAR | frozenset(":/")
_BASE64 = _ALPHA | _DIGITS | frozenset("+/=")
_OWS = " \t"


class _Parser:
    """RFC 8941 §4.2's parsing algorithms for a Dictionary, over an ASCII string."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def _peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def _skip(self, chars: str) -> None:
        while self.i < len(self.s) and self.s[self.i] in chars:
            self.i += 1

    def dictionary(self) -> dict[str, object]:
        self._skip(" ")
        members: dict[str, object] = {}
        while self.i < len(self.s):
            key = self._key()
            if self._peek() == "=":
                self.i += 1
                members[key] = self._inner_list() if self._peek() == "(" else self._item()
            else:
                members[key] = True
                self._parameters()
            self._skip(_OWS)
            if self.i == len(self.s):
                return members
            if self._peek() != ",":
                raise _Invalid("expected a comma between members")
            self.i += 1
            self._skip(_OWS)
            if self.i == len(self.s):
                raise _Invalid("a trailing comma")
        return members

    def _key(self) -> str:
        if self._peek() not in _KEY_FIRST:
            raise _Invalid("a key starts with a lowercase letter or *")
        start = self.i
        while self.i < len(self.s) and self.s[self.i] in _KEY:
            self.i += 1
        return self.s[start : self.i]

    def _parameters(self) -> None:
        while self._peek() == ";":
            self.i += 1
            self._skip(" ")
            self._key()
            if self._peek() == "=":
                self.i += 1
                self._bare_item()

    def _item(self) -> object:
        value = self._bare_item()
        self._parameters()
        return value

    def _inner_list(self) -> object:
        self.i += 1  # "("
        items: list[object] = []
        while self.i < len(self.s):
            self._skip(" ")
            if self._peek() == ")":
                self.i += 1
                self._parameters()
                return items
            items.append(self._item())
            if self._peek() not in (" ", ")"):
                raise _Invalid("inner list items are separated by spaces")
        raise _Invalid("an inner list without its )")

    def _bare_item(self) -> object:
        c = self._peek()
        if c == "-" or c in _DIGITS:
            return self._number()
        if c == '"':
            return self._string()
        if c in _ALPHA or c == "*":
            return self._token()
        if c == ":":
            return self._bytes()
        if c == "?":
            return self._boolean()
        raise _Invalid("not an item")

    def _number(self) -> int | float:
        start = self.i
        if self._peek() == "-":
            self.i += 1
        if self._peek() not in _DIGITS:
            raise _Invalid("a number needs a digit")
        digits_start = self.i
        while self._peek() in _DIGITS:
            self.i += 1
        if self._peek() != ".":
            if self.i - digits_start > 15:
                raise _Invalid("an integer has at most 15 digits")
            return int(self.s[start : self.i])
        if self.i - digits_start > 12:
            raise _Invalid("a decimal has at most 12 integer digits")
        self.i += 1
        fraction_start = self.i
        while self._peek() in _DIGITS:
            self.i += 1
        if not 1 <= self.i - fraction_start <= 3:
            raise _Invalid("a decimal has one to three fraction digits")
        return float(self.s[start : self.i])

    def _string(self) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            self.i += 1
            if c == "\\":
                if self._peek() not in ('"', "\\"):
                    raise _Invalid('a string escapes only " and \\')
                out.append(self.s[self.i])
                self.i += 1
            elif c == '"':
                return "".join(out)
            elif not " " <= c <= "~":
                raise _Invalid("a string holds visible ASCII only")
            else:
                out.append(c)
        raise _Invalid("a string without its closing quote")

    def _token(self) -> str:
        start = self.i
        self.i += 1
        while self._peek() in _TOKEN:
            self.i += 1
        return self.s[start : self.i]

    def _bytes(self) -> bytes:
        self.i += 1
        start = self.i
        while self._peek() and self._peek() != ":":
            if self._peek() not in _BASE64:
                raise _Invalid("a byte sequence holds base64 only")
            self.i += 1
        if self._peek() != ":":
            raise _Invalid("a byte sequence without its closing colon")
        self.i += 1
        return self.s[start : self.i - 1].encode()

    def _boolean(self) -> bool:
        self.i += 1
        c = self._peek()
        if c not in ("0", "1"):
            raise _Invalid("a boolean is ?0 or ?1")
        self.i += 1
        return c == "1"


@lru_cache(maxsize=256)  # clients send the same few values; bounded, so a scanner cannot grow it
def header_urgency(value: bytes) -> int | None:
    """The urgency a ``Priority`` field value sets (see the module), or None: it sets none."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return None
    if any(not (" " <= c <= "~" or c == "\t") for c in text):
        return None
    try:
        members = _Parser(text.strip(" \t")).dictionary()
    except _Invalid:
        return None
    u = members.get("u")
    return u if type(u) is int and 0 <= u <= 7 else None  # type(...) is int: Boolean true is no urgency


def urgency(priority: bytes | str | None, key_default: int | None = None) -> int:
    """The request's urgency: its ``Priority`` field's, else its API key's default, else 3."""
    found = None
    if isinstance(priority, str):  # gRPC metadata: ASCII, or it is no valid field
        priority = priority.encode("ascii") if priority.isascii() else b"\xff"
    if priority is not None:
        found = header_urgency(priority)
    if found is not None:
        return found
    return key_default if key_default is not None else DEFAULT_URGENCY
