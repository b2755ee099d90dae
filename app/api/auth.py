"""API keys: with keys configured, every route but the open ones needs ``Authorization: Bearer <key>``.

Checked before the body is read, so an unauthenticated caller costs nothing. The presented key is
hashed and compared with the hash of every configured key by ``hmac.compare_digest`` (equal lengths, no
early exit), so timing reveals neither which key nor how much of one matched. Keys are never logged or
echoed. A key may carry a default urgency for its requests (``key:u=7`` in the setting: background work);
it is looked up by the presented key's digest once the key is known to be valid, and applies where the
request's ``Priority`` header sets none (:mod:`app.api.urgency`).

:meth:`ApiKeys.check` is the whole check, called by the HTTP gates (:mod:`app.api.http.gates`, for the data
path and every other route) and by gRPC calls (:mod:`app.api.rpc.calls`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

# Operational routes and the API docs: open unless auth_ops_routes is set.
OPS_PATHS = frozenset(
    {"/health", "/ready", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class ApiKeys:
    """The configured keys, as digests; :meth:`check` is the whole check.

    Args:
        keys: the keys.
        urgencies: the default urgency of the keys that have one (``key:u=N``).
    """

    def __init__(self, keys: tuple[str, ...], urgencies: Mapping[str, int] | None = None) -> None:
        if not keys:
            raise ValueError("ApiKeys needs at least one key")
        self._digests = tuple(_digest(k) for k in keys)
        self._urgencies = {_digest(k): u for k, u in (urgencies or {}).items()}

    @classmethod
    def from_entries(cls, entries: tuple[tuple[str, int | None], ...]) -> ApiKeys:
        """From :meth:`app.settings.Settings.api_key_entries`: each key with its urgency or None."""
        return cls(tuple(k for k, _ in entries), {k: u for k, u in entries if u is not None})

    def _matches(self, digest: bytes) -> bool:
        ok = False
        for known in self._digests:  # every key, always: no early exit on a match
            ok |= hmac.compare_digest(digest, known)
        return ok

    def check(self, authorization: bytes | None) -> tuple[str | None, int | None]:
        """What is wrong with the ``Authorization`` header (None: it may pass), and the valid key's default
        urgency (None: it has none)."""
        if authorization is None:
            return "no API key: send the header Authorization: Bearer <key>", None
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return "malformed Authorization header: send Authorization: Bearer <key>", None
        digest = _digest(token.strip())
        if not self._matches(digest):
            return "unknown API key", None
        return None, self._urgencies.get(digest)
