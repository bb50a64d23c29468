"""Abort a TCP connection so that the peer sees it: RST, never FIN.

``transport.abort()`` alone closes the socket without lingering; on uvloop (and for a socket
whose send buffer happens to be empty) the kernel then sends a FIN, which a client reads as a
clean end: a response cut short would look whole. With SO_LINGER {on, 0} set first, close()
sends RST, so the client gets ECONNRESET (curl: "Recv failure: Connection reset by peer",
Prometheus: a failed scrape).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

_LINGER_ZERO = struct.pack("ii", 1, 0)


def abort_with_rst(transport: asyncio.WriteTransport) -> None:
    """Close ``transport`` now, discarding unsent data, with a TCP RST."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    transport.abort()
