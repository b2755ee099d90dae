"""The Priority header read as RFC 9218 and RFC 8941 say: u=0 … u=7, unknown members and bad values
ignored, a field that does not parse ignored whole, the key's default, then 3."""

from __future__ import annotations

import pytest

from app.api.urgency import header_urgency, urgency

# (field value, the urgency it sets or None)
CASES = [
    (b"u=0", 0),
    (b"u=7", 7),
    (b"u=5, i", 5),  # RFC 9218's own example: a bare i is Boolean true
    (b"i, u=2", 2),
    (b"u=03", 3),  # leading zeros are an Integer still (RFC 8941 §3.3.1)
    (b"  u=6  ", 6),
    (b"u=1;foo=bar", 1),  # a member's parameters are ignored, not its value
    (b'u=4, x=?1, y=:aGk=:, z="a,u=0", w=(1 2);q, t=tok/en', 4),
    (b"u=0, u=6", 6),  # the last of a key wins
    (b"u=0,\tu=1", 1),
    (b"i", None),  # no urgency: the default applies
    (b"", None),
    (b"u=8", None),  # out of range: ignored (RFC 9218 §4)
    (b"u=-1", None),
    (b"u=0, u=9", None),  # the last wins, and it is out of range
    (b"u", None),  # a bare u is Boolean true: a value of unexpected type
    (b"u=?1", None),
    (b"u=1.0", None),  # a Decimal
    (b'u="1"', None),  # a String
    (b"u=low", None),  # a Token
    (b"u=(1)", None),  # an Inner List
    (b"a=1;u=0", None),  # u is a parameter of a, not a member
    (b'x="a,u=0"', None),  # the comma is inside a String
    (b"U=0", None),  # not a Dictionary: keys are lowercase; the whole field is ignored
    (b"u=0, @bad", None),
    (b"u=0,", None),  # a trailing comma
    (b"u=0 u=1", None),
    (b"u=0, x=1234567890123456", None),  # an Integer has at most 15 digits
    (b'u=0, x="\\q"', None),  # a String escapes only " and \
    (b'u=0, x="\xc3\xa9"', None),  # not visible ASCII
    (b"u=1\x00", None),
]


@pytest.mark.parametrize(("field", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_a_field_sets_the_urgency_the_rfcs_say(field: bytes, expected: int | None) -> None:
    assert header_urgency(field) == expected


def test_where_the_field_sets_none_the_keys_default_then_three() -> None:
    assert urgency(None) == 3
    assert urgency(b"i") == 3
    assert urgency(None, 7) == 7
    assert urgency(b"u=9", 7) == 7  # ignored, so the key's default
    assert urgency(b"u=1", 7) == 1  # the request's own urgency wins
    assert urgency("u=2") == 2  # gRPC metadata is a str
    assert urgency("u=2\u00e9") == 3
