"""The HTTP listener on callbacks: nothing runs for a connection between its requests, and a
client that stops reading holds the stream's credit instead of growing the gateway's memory."""

from __future__ import annotations

import asyncio

from aiohttp import web

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
            await asyncio.sleep(0.05)
            assert _proxy_tasks() == []  # 20 idle kept connections: timers only
            assert len(proxy.context.idle) == 20
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
