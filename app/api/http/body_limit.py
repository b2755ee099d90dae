"""Bodies over ``max_body_bytes`` are refused without being read: 413 from the error table.

A declared ``Content-Length`` over the limit is refused before the body is read (:func:`declared_length`,
checked by :meth:`app.api.http.gates.Gates.admit`). A body without one (chunked) is counted as it
streams: the data path reads it with :func:`read_body`, every other route is run :func:`limited`, which
tells the app the client left once the count passes the limit (so it stops reading) and replaces whatever
it answers with the 413. Either way the rest goes unread, so the 413 closes the connection.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.drain import CLOSE
from app.api.errors import send_error
from app.errors import ClientGone, PayloadTooLarge


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


async def read_body(receive: Receive, max_body_bytes: int) -> bytes:
    """The request body, counted against the limit as it comes.

    Raises:
        PayloadTooLarge: over the limit (the rest is not read).
        ClientGone: the client left before the end of it.
    """
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")  # the whole body in one message: the common case
        if len(body) > max_body_bytes:
            raise too_large(max_body_bytes)
        return body
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body_bytes:
                raise too_large(max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientGone("client disconnected")
        message = await receive()


async def limited(app: ASGIApp, scope: Scope, receive: Receive, send: Send, max_body_bytes: int) -> None:
    """Run ``app`` on the request with its body counted against the limit as the app reads it; past the
    limit the app is told the client left, and the request is answered 413 whatever the app answers."""
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
            if received > max_body_bytes:
                over = True
                return {"type": "http.disconnect"}
        return message

    async def guarded_send(message: Message) -> None:
        nonlocal answered
        if not over:
            await send(message)
        elif not answered:
            answered = True
            await send_error(too_large(max_body_bytes), scope, send, [CLOSE])

    try:
        await app(scope, limited_receive, guarded_send)
    except Exception:
        # The app may raise on the disconnect we simulated; that is the 413, not a fault.
        if not over:
            raise
    if over and not answered:
        await send_error(too_large(max_body_bytes), scope, send, [CLOSE])
