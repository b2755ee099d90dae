"""Graceful shutdown, the HTTP half: once draining, refuse new work with 503 and close every connection.

``python -m app`` turns SIGTERM (or SIGINT) into :meth:`Drain.begin` (see :mod:`app.__main__`). From then
on, for ``shutdown_drain_s`` seconds the listener stays open and:

- ``/ready`` and every data route answer 503 (``unhealthy``) at once, so a load balancer takes the
  replica out and a client that still reaches it gets an answer it can retry elsewhere;
- requests accepted before the signal run to the end;
- every response carries ``Connection: close``, so no idle keep-alive connection is left for the
  listener's closing to race with;
- ``/health`` and ``/metrics`` still answer (the process is alive, and its last numbers are readable).

Then uvicorn closes the listener, waits for the requests still in flight up to the rest of
``shutdown_grace_s``, and the lifespan stops the engine. Connections after that are refused by the OS,
and any the kernel had queued but the server had not yet accepted are reset: neither kind was started,
so a client may retry it on another replica. That is the contract: every request is answered, refused
with 503, or refused at the TCP level — none is dropped after it was accepted.

A worker that retires (:meth:`Drain.retire`: the supervisor replaced it, :mod:`app.serving.supervisor`)
refuses nothing: its listener is closed (the other workers accept on the shared socket), and every
response it still sends carries ``Connection: close``, so each client's next request opens a connection
that another worker accepts.

The HTTP gates (:mod:`app.api.http.gates`) read :class:`Drain` on every request: :attr:`Drain.draining`
before anything else (then :func:`refuse`), :attr:`Drain.closing` on every answer (then :func:`with_close`).
gRPC calls refuse with :func:`shutting_down` (UNAVAILABLE).
"""

from __future__ import annotations

import time

from starlette.types import Receive, Scope, Send

from app.api.errors import send_error
from app.errors import NotReady

# Answered while draining: liveness and metrics. Everything else is refused.
LIVE_PATHS = frozenset({"/health", "/metrics"})

CLOSE = (b"connection", b"close")


class Drain:
    """Whether the process is shutting down. Set once, possibly from a signal handler: a plain store."""

    def __init__(self) -> None:
        self.since: float | None = None  # time.monotonic() of the signal
        # Every response closes its connection: while draining or retiring. Kept as one attribute, read
        # on every response.
        self.closing = False

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self.closing = True

    def retire(self) -> None:
        """Serve on, closing each connection after its response (see the module docstring)."""
        self.closing = True

    def elapsed(self) -> float:
        """Seconds since draining began; 0 when it has not."""
        return 0.0 if self.since is None else time.monotonic() - self.since


def with_close(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [*(h for h in headers if h[0].lower() != b"connection"), CLOSE]


async def refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> int:
    """Answer a request that comes in while draining: 503 (``unhealthy``) with ``connection: close``,
    after reading what is left of its body (up to ``limit`` bytes). The HTTP gates call it for the data
    path and every other route alike (:mod:`app.api.http.gates`). Returns the status.

    Why read a body only to drop it: a socket closed with bytes still unread makes the kernel send the
    client a reset instead of a close, and a client that gets the reset before it has read the answer
    loses the answer (Linux drops it), so it would see a dropped connection where it should see a 503.
    A body past ``limit`` is read only that far (the reset is then the lesser cost), and one the client
    holds back for ``Expect: 100-continue`` not at all (nothing of it is on the way unless asked for)."""
    if not any(name == b"expect" for name, _ in scope["headers"]):
        size = 0
        while size <= limit:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
            size += len(message.get("body", b""))
    return await send_error(shutting_down(), scope, send, [CLOSE])


def shutting_down() -> NotReady:
    """What a request that comes in while draining is answered (503; gRPC: UNAVAILABLE)."""
    return NotReady("the service is shutting down; retry on another replica")
