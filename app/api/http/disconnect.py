"""Cancel a request's work when its client goes away.

The body has been read by the time a route runs, so the next ASGI message can only be the disconnect
(or the end of the response). The service call is raced against it; if the client leaves first, the
call is cancelled, which cancels its ticket so the engine drops the request's queued inputs.

Only work still running after :data:`WATCH_AFTER_S` is watched: listening for the disconnect takes a
task of its own (~10 µs of the event loop's time per request), and most requests are answered
sooner. What a client that leaves within that time can save is at most that much of the engine's time,
about one batch's; the requests that wait longest (a full queue) are the ones watched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from app.errors import ClientGone

T = TypeVar("T")

# Seconds a request's work runs before its client is watched (a timer costs ~0.5 µs; a task ~10 µs).
WATCH_AFTER_S = 0.01


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` in this task; if the client disconnects first, cancel it and raise :class:`ClientGone`.

    The work runs in the request's own task (not a task of its own raced with ``asyncio.wait``); after
    :data:`WATCH_AFTER_S` a watcher task waits for the disconnect and cancels this one.
    """
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("unless_disconnected must run inside a task")
    loop = current.get_loop()
    receive = request.receive
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        current.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        result = await work
    except asyncio.CancelledError:
        if gone:
            current.uncancel()
            raise ClientGone("client disconnected") from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    if gone and current.cancelling():  # it left just as the work finished: nobody reads the answer
        current.uncancel()
        raise ClientGone("client disconnected")
    return result
