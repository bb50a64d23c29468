"""Socket reads into one reused buffer, handed on as bytes of the size that arrived.

asyncio's selector transports read with ``sock.recv(256 KiB)``: each read allocates 256 KiB,
which glibc serves by mmap (over its 128 KiB threshold), then shrinks by mremap to what
arrived, and frees by munmap: three syscalls per read. glibc raises its threshold only when a
block over it is freed, and the freed block is the shrunk one, so it never adapts. strace of
an agent relaying 100 KB scrapes at c=1: 3,070 mmap, mremap and munmap each in 4 s, and the
agent's CPU per scrape ~+40 % (whether a process falls into it depends on its allocation
history). uvloop reads into a buffer of its own and allocates the exact size; this does the
same on any loop: the transport reads into the thread's buffer (``get_buffer``), and
``buffer_updated`` passes a copy of the bytes that arrived to ``data_received``, which keeps
its meaning. An allocation of the exact size that is freed whole is one the threshold adapts
to.

uvloop needs none of it: a CopyingReader is also an :class:`asyncio.Protocol`, which uvloop
takes as a plain protocol (``data_received`` straight from its own read, no ``get_buffer``
and ``buffer_updated`` calls in Python: three fewer calls per read, what an L3 packet pays),
while the standard library's transports see the BufferedProtocol first.
"""

from __future__ import annotations

import asyncio
import mmap
import threading

__all__ = ["READ_BYTES", "CopyingReader"]

#: Largest single read (asyncio's own).
READ_BYTES = 256 * 1024

_local = threading.local()


def _thread_buffer() -> memoryview:
    buffer: memoryview | None = getattr(_local, "buffer", None)
    if buffer is None:
        # anonymous memory: a page is resident once a read reached it (a bytearray would be
        # zero-filled, all 256 KiB resident from the start in every process)
        buffer = _local.buffer = memoryview(mmap.mmap(-1, READ_BYTES))
    return buffer


class CopyingReader(asyncio.BufferedProtocol, asyncio.Protocol):
    """A protocol whose reads land in its thread's shared buffer on the standard library's
    loop (uvloop: plain ``data_received``); subclasses implement ``data_received`` as for
    :class:`asyncio.Protocol` (the bytes are theirs to keep)."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return _thread_buffer()

    def buffer_updated(self, nbytes: int) -> None:  # the same thread as its get_buffer
        self.data_received(bytes(_thread_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        raise NotImplementedError
