"""CopyingReader: reads land in the thread's buffer, data_received gets bytes of their own
(kept safely past the next read), over the standard event loop's real sockets; on uvloop
the same protocol is read the plain way (data_received from uvloop's own read)."""

from __future__ import annotations

import asyncio

import uvloop

from raven.transport.read_buffer import READ_BYTES, CopyingReader


class Collect(CopyingReader):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def eof_received(self) -> bool:
        self.eof.set_result(None)
        return False


async def test_chunks_are_bytes_of_their_own_size() -> None:
    reader = Collect()
    buffer = reader.get_buffer(-1)
    assert len(buffer) == READ_BYTES
    buffer[:5] = b"hello"
    reader.buffer_updated(5)
    buffer[:5] = b"world"  # the next read reuses the buffer
    reader.buffer_updated(3)
    assert reader.chunks == [b"hello", b"wor"]
    assert all(type(c) is bytes for c in reader.chunks)


async def test_a_real_connection_delivers_every_byte_in_order() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: several reads of the shared buffer
    proto = await _exchange(payload)
    assert b"".join(proto.chunks) == payload


class Spy(Collect):
    def __init__(self) -> None:
        super().__init__()
        self.buffers = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        self.buffers += 1
        return super().get_buffer(sizehint)


async def _exchange(payload: bytes) -> Spy:
    loop = asyncio.get_running_loop()
    received: list[Spy] = []

    def factory() -> Spy:
        received.append(Spy())
        return received[-1]

    server = await loop.create_server(factory, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        writer.write_eof()
        await writer.drain()
        (proto,) = received
        await asyncio.wait_for(proto.eof, 10)
        writer.close()
        return proto
    finally:
        server.close()
        await server.wait_closed()


def test_the_standard_loop_reads_into_the_buffer_and_uvloop_reads_its_own_way() -> None:
    payload = bytes(range(256)) * 512
    standard = asyncio.run(_exchange(payload))
    assert b"".join(standard.chunks) == payload and standard.buffers > 0
    plain = uvloop.run(_exchange(payload))
    assert b"".join(plain.chunks) == payload and plain.buffers == 0
