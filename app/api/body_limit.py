"""Refuse bodies over ``max_body_bytes`` without reading them: 413 from the error table.

A declared ``Content-Length`` over the limit is refused before the app runs. A body without one
(chunked) is counted while it streams; once over, the app is told the client left (so it stops
reading) and whatever it answers is replaced by the 413.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import send_error
from app.errors import PayloadTooLarge


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _error(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body is larger than the limit of {self.max_body_bytes} bytes")

    async def _send_413(self, scope: Scope, send: Send) -> None:
        await send_error(self._error(), scope, send, [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # malformed; the server rejects it, and the stream count still applies
                if declared > self.max_body_bytes:
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
