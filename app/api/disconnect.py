"""Cancel a request's work when its client goes away.

The body has been read by the time a route runs, so the next ASGI message can only be the disconnect
(or the end of the response). The service call is raced against it; if the client leaves first, the
call is cancelled, which cancels its ticket so the engine drops the request's queued inputs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from app.errors import ClientGone

T = TypeVar("T")


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` in this task; if the client disconnects first, cancel it and raise :class:`ClientGone`.

    One watcher task per request, and the work runs in the request's own task (not a task of its own
    raced with ``asyncio.wait``): each extra task and wait costs the event loop, on every request.
    """
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("unless_disconnected must run inside a task")
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if gone:
            current.uncancel()
            raise ClientGone("client disconnected") from None
        raise
    finally:
        watcher.cancel()
    if gone and current.cancelling():  # it left just as the work finished: nobody reads the answer
        current.uncancel()
        raise ClientGone("client disconnected")
    return result
