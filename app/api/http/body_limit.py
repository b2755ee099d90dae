"""Refuse bodies over ``max_body_bytes`` without reading them: 413 from the error table.

A declared ``Content-Length`` over the limit is refused before the app runs. A body without one
(chunked) is counted while it streams; once over, the app is told the client left (so it stops
reading) and whatever it answers is replaced by the 413.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.drain import CLOSE
from app.api.errors import send_error
from app.errors import PayloadTooLarge


def too_large(max_body_bytes: int) -> PayloadTooLarge:
    """The 413 for a body over the limit; answered with ``connection: close`` (the rest goes unread)."""
    return PayloadTooLarge(f"request body is larger than the limit of {max_body_bytes} bytes")


def declared_length(value: bytes) -> int:
    """A ``Content-Length`` value; 0 when malformed (the server rejects it, and the stream count still
    applies)."""
    try:
        return int(value)
    except ValueError:
        return 0


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def _send_413(self, scope: Scope, send: Send) -> None:
        await send_error(too_large(self.max_body_bytes), scope, send, [CLOSE])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and declared_length(value) > self.max_body_bytes:
                await self._send_413(scope, send)
                return

        received = 0
        over = False
        answered = False

        async def limited_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if not over:
                await send(message)
            elif not answered:
                answered = True
                await self._send_413(scope, send)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # The app may raise on the disconnect we simulated; that is the 413, not a fault.
            if not over:
                raise
        if over and not answered:
            await self._send_413(scope, send)
