"""The HTTP listener on callbacks: nothing runs for a connection between its requests, and a
client that stops reading holds the stream's credit instead of growing the gateway's memory."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from raven.protocol.codes import StreamCode
from raven.transport.stream import StreamResetError
from tests.helpers import wait_for
from tests.helpers.proxy import direct, running_proxy, serve_app

MIB = b"x" * (1 << 20)
#: more than the kernel buffers on both sides of the proxy can hold
BIG_MIB = 64


def _proxy_tasks() -> list[str]:
    names = []
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        qualname = getattr(coro, "__qualname__", "")
        if qualname.startswith(("HttpConnection", "Exchange", "ClientConnection")):
            names.append(qualname)
    return names


async def _get(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, host: bytes) -> bytes:
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


async def test_idle_keep_alive_connections_run_no_task(target_port: int) -> None:
    async with running_proxy(direct()) as (proxy, _, _):
        host = f"edge-gpu-1:{target_port}".encode()
        conns = [await asyncio.open_connection(*proxy.http_address) for _ in range(20)]
        try:
            for reader, writer in conns:
                assert (await _get(writer, reader, host)).startswith(b"HTTP/1.1 200 OK")
            # 20 idle kept connections: timers only (once the last response's writes are done)
            await wait_for(lambda: len(proxy.context.idle) == 20, "20 idle connections")
            assert _proxy_tasks() == []
            for reader, writer in conns:  # and each serves its next request
                assert (await _get(writer, reader, host)).startswith(b"HTTP/1.1 200 OK")
        finally:
            for _, writer in conns:
                writer.close()


async def test_a_client_that_stops_reading_holds_back_the_stream() -> None:
    sent = asyncio.Event()

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(BIG_MIB << 20)})
        await response.prepare(request)
        for _ in range(BIG_MIB):  # blocks once the proxy stops taking it: it must
            await response.write(MIB)
        sent.set()
        return response

    app = web.Application()
    app.router.add_get("/big", big)
    async with serve_app(app) as port, running_proxy(direct()) as (proxy, _, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        try:
            writer.write(b"GET /big HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n\r\n" % port)
            await asyncio.sleep(1.0)  # the client reads nothing meanwhile
            assert not sent.is_set()  # backpressure reached the target
            buffered = [
                c.transport.get_write_buffer_size() for c in proxy.connections if c.transport
            ]
            assert max(buffered) < 4 << 20  # what the gateway holds for the client is bounded
            got = 0
            while got < BIG_MIB << 20:  # reading resumes the flow: all of it arrives
                chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
                assert chunk
                got += len(chunk)
            await asyncio.wait_for(sent.wait(), 10)
        finally:
            writer.close()


def _held_app(
    release: asyncio.Event, started: asyncio.Event, *, head_first: bool
) -> web.Application:
    """/fast answers at once; /held waits for ``release`` (after its head when
    ``head_first``: a response that started)."""

    async def fast(request: web.Request) -> web.Response:
        return web.Response(body=b"ok\n")

    async def held(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "3"})
        if head_first:
            await response.prepare(request)
        started.set()
        await release.wait()
        await response.prepare(request)
        await response.write(b"ok\n")
        return response

    app = web.Application()
    app.router.add_get("/fast", fast)
    app.router.add_get("/held", held)
    return app


async def _kept_connection(
    proxy: object, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection whose first request left its stream in the pool."""
    reader, writer = await asyncio.open_connection(*proxy.http_address)  # type: ignore[attr-defined]
    writer.write(b"GET /fast HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n\r\n" % port)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(3) == b"ok\n"
    return reader, writer


async def test_a_request_on_a_kept_stream_runs_no_task() -> None:
    """A bodiless request whose target has a kept stream is served by callbacks: while it is
    in flight no proxy task exists, the connection's in-flight marker is a plain future."""
    release, started = asyncio.Event(), asyncio.Event()
    app = _held_app(release, started, head_first=False)
    async with serve_app(app) as port, running_proxy(direct()) as (proxy, _, _):
        reader, writer = await _kept_connection(proxy, port)
        try:
            assert len(proxy.context.streams) == 1
            writer.write(b"GET /held HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n\r\n" % port)
            await asyncio.wait_for(started.wait(), 5)
            assert len(proxy.context.streams) == 0  # taken
            (conn,) = [c for c in proxy.connections if c.task is not None]
            assert not isinstance(conn.task, asyncio.Task)
            assert _proxy_tasks() == []
            release.set()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(3) == b"ok\n"
            await wait_for(  # back in the pool
                lambda: conn.task is None and len(proxy.context.streams) == 1, "the stream kept"
            )
        finally:
            writer.close()


@pytest.mark.parametrize("head_first", [False, True])
async def test_a_kept_stream_request_past_its_deadline(head_first: bool) -> None:
    """The one timer of a request served by callbacks: before the response started, 504;
    after, the client connection is cut (RST), never a short body passed off as whole."""
    release, started = asyncio.Event(), asyncio.Event()
    app = _held_app(release, started, head_first=head_first)
    async with serve_app(app) as port, running_proxy(direct()) as (proxy, registry, _):
        reader, writer = await _kept_connection(proxy, port)
        try:
            writer.write(
                b"GET /held HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n"
                b"X-Prometheus-Scrape-Timeout-Seconds: 0.3\r\n\r\n" % port
            )
            if head_first:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200")
                with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
                    await asyncio.wait_for(reader.readexactly(3), 5)
            else:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 504")
            value = registry.get_sample_value(
                "raven_proxy_errors_total", {"reason": "scrape_timeout"}
            )
            assert value == 1
        finally:
            release.set()
            writer.close()


async def test_a_drain_waits_for_a_kept_stream_request_then_cuts_it() -> None:
    """A drain waits for a request served by callbacks like for a task, and cuts it (RST)
    once its grace is over."""
    release, started = asyncio.Event(), asyncio.Event()
    app = _held_app(release, started, head_first=True)
    async with serve_app(app) as port, running_proxy(direct()) as (proxy, _, _):
        reader, writer = await _kept_connection(proxy, port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n\r\n" % port)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await proxy.stop(grace_s=0.3)
        assert loop.time() - began >= 0.25  # it waited for the request
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(3), 5)
        writer.close()
        release.set()


async def test_pipelined_refused_requests_are_answered_in_order_without_recursion() -> None:
    """Requests answered at once (an IP literal is refused) are served in a loop: a client
    that pipelines thousands of them gets every answer, in order."""
    async with running_proxy(direct()) as (proxy, _, _):
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        try:
            count = 3000
            request = b"GET /metrics HTTP/1.1\r\nHost: 10.1.2.3:9400\r\n\r\n"
            writer.write(request * count)
            answers = 0
            while answers < count:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 4")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                answers += 1
        finally:
            writer.close()


class _BrokenKeptStream:
    """A kept stream that looks whole to the pool but fails the moment a request is sent."""

    def __init__(self) -> None:
        self.closed = False

    def reusable(self) -> bool:
        return not self.closed

    def try_send(self, data: bytes) -> bool:
        raise StreamResetError(StreamCode.TARGET_RESET, "gone while idle")

    def end(self) -> None:
        pass

    def detach(self) -> None:
        pass

    def reset(self, code: StreamCode, reason: str = "") -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


async def test_a_kept_stream_that_fails_on_send_leaves_the_request_to_a_new_stream() -> None:
    release, started = asyncio.Event(), asyncio.Event()
    release.set()
    app = _held_app(release, started, head_first=False)
    async with serve_app(app) as port, running_proxy(direct()) as (proxy, _, _):
        broken = _BrokenKeptStream()
        proxy.context.streams.put(("edge-gpu-1", port), broken)  # type: ignore[arg-type]
        reader, writer = await asyncio.open_connection(*proxy.http_address)
        try:
            writer.write(b"GET /fast HTTP/1.1\r\nHost: edge-gpu-1:%d\r\n\r\n" % port)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(3) == b"ok\n"
            assert broken.closed
        finally:
            writer.close()
