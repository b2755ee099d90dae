"""loadtest.loadgen's keep-alive connection: Connection: close, a connection the server closed while idle,
and one closed under a request before any answer (sent again once, on a new connection; counted); and
cells pooled into one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from loadtest.loadgen import CellResult, _Connection

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n%s\r\nok"


class Server:
    """A loopback HTTP server that does to each request what ``script`` says, in order:
    ``answer``, ``close-header`` (answers with Connection: close, then closes), ``answer-then-close``
    (answers without saying so, then closes), ``drop`` (reads the request, closes without an answer)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.connections = 0
        self.closed = asyncio.Event()  # set each time the server closes a connection

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.script:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                step = self.script.pop(0)
                if step == "drop":
                    return
                writer.write(ANSWER % (b"Connection: close\r\n" if step == "close-header" else b""))
                await writer.drain()
                if step != "answer":
                    return
        except asyncio.IncompleteReadError:  # the client closed it
            return
        finally:
            writer.close()
            self.closed.set()


@asynccontextmanager
async def serving(script: list[str]) -> AsyncIterator[tuple[Server, int]]:
    server = Server(script)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    try:
        yield server, listener.sockets[0].getsockname()[1]
    finally:
        listener.close()


async def _eof_seen(conn: _Connection) -> None:
    """Until the client's end has taken in the server's close (event-loop turns, no clock)."""
    while conn.reader is not None and not conn.reader.at_eof():
        await asyncio.sleep(0)


def test_an_answer_with_connection_close_closes_it_and_the_next_request_opens_another() -> None:
    async def main() -> None:
        async with serving(["close-header", "answer"]) as (server, port):
            conn = _Connection("127.0.0.1", port)
            assert await conn.request("POST", "/", b"{}") == (200, b"ok")
            assert conn.writer is None  # closed at once, not at the next request
            assert await conn.request("POST", "/", b"{}") == (200, b"ok")
            assert (server.connections, conn.reopened, conn.retried) == (2, 0, 0)
            conn.close()

    asyncio.run(main())


def test_a_connection_the_server_closed_while_idle_is_reopened_before_the_request() -> None:
    async def main() -> None:
        async with serving(["answer-then-close", "answer"]) as (server, port):
            conn = _Connection("127.0.0.1", port)
            assert (await conn.request("POST", "/", b"{}"))[0] == 200
            await server.closed.wait()
            await _eof_seen(conn)
            assert (await conn.request("POST", "/", b"{}"))[0] == 200
            assert (server.connections, conn.reopened, conn.retried, conn.last_retried) == (2, 1, 0, False)
            conn.close()

    asyncio.run(main())


def test_a_reused_connection_closed_under_a_request_before_any_answer_sends_it_again_once() -> None:
    async def main() -> None:
        async with serving(["answer", "drop", "answer"]) as (server, port):
            conn = _Connection("127.0.0.1", port)
            assert (await conn.request("POST", "/", b"{}"))[0] == 200
            assert (await conn.request("POST", "/", b"{}"))[0] == 200  # dropped, then sent again
            assert (server.connections, conn.retried, conn.last_retried, conn.reopened) == (2, 1, True, 0)
            conn.close()

    asyncio.run(main())


@pytest.mark.parametrize(("script", "retried"), [(["drop"], 0), (["answer", "drop", "drop"], 1)])
def test_a_fresh_connection_or_a_second_drop_is_not_sent_again(script: list[str], retried: int) -> None:
    async def main() -> None:
        async with serving(script) as (_, port):
            conn = _Connection("127.0.0.1", port)
            if len(script) > 1:
                await conn.request("POST", "/", b"{}")
            with pytest.raises(asyncio.IncompleteReadError):
                await conn.request("POST", "/", b"{}")
            assert not conn.received and conn.retried == retried
            conn.close()

    asyncio.run(main())


def test_cells_pooled_count_over_their_summed_windows_and_keep_every_latency() -> None:
    first = CellResult(10.0, 100, 100, 0, [5.0] * 99 + [50.0], 1.0, {200: 100})
    second = CellResult(30.0, 100, 800, 2, [1.0] * 100, 2.0, {200: 98, 503: 2}, first_error="503")
    pooled = CellResult.pooled([first, second])
    assert (pooled.requests_per_s, pooled.sentences_per_s) == (200 / 40, 900 / 40)
    assert pooled.errors == 2 and pooled.status_counts == {200: 198, 503: 2} and pooled.first_error == "503"
    assert sorted(pooled.latencies_ms) == sorted(first.latencies_ms + second.latencies_ms)
    assert pooled.client_cores == 3.0 / 40
