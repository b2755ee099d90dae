"""API keys: with keys configured, every route but the open ones needs ``Authorization: Bearer <key>``.

Checked before the body is read, so an unauthenticated caller costs nothing. The presented key is
hashed and compared with the hash of every configured key by ``hmac.compare_digest`` (equal lengths, no
early exit), so timing reveals neither which key nor how much of one matched. Keys are never logged or
echoed.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import send_error
from app.errors import Unauthorized

# Operational routes and the API docs: open unless auth_ops_routes is set.
OPS_PATHS = frozenset(
    {"/health", "/ready", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class ApiKeys:
    """The configured keys, as digests; :meth:`problem` is the whole check, for the middleware and the
    data path (:mod:`app.api.http.fast`) alike."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        if not keys:
            raise ValueError("ApiKeys needs at least one key")
        self._digests = tuple(_digest(k) for k in keys)

    def valid(self, presented: bytes) -> bool:
        digest = _digest(presented)
        ok = False
        for known in self._digests:  # every key, always: no early exit on a match
            ok |= hmac.compare_digest(digest, known)
        return ok

    def problem(self, authorization: bytes | None) -> str | None:
        """What is wrong with the request's ``Authorization`` header (its first), or None: it may pass."""
        if authorization is None:
            return "no API key: send the header Authorization: Bearer <key>"
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return "malformed Authorization header: send Authorization: Bearer <key>"
        if not self.valid(token.strip()):
            return "unknown API key"
        return None


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...], open_paths: frozenset[str]) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.app = app
        self.open_paths = open_paths
        self.keys = ApiKeys(keys)

    def valid(self, presented: bytes) -> bool:
        return self.keys.valid(presented)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        problem = self.keys.problem(authorization)
        if problem is None:
            await self.app(scope, receive, send)
            return
        await send_error(Unauthorized(problem), scope, send)
