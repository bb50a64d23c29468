"""DirectOpener: the in-memory twin of a tunnel. Opens plain TCP to a node table.

Used by tests and the demo in place of the agent registry: same :class:`StreamOpener` contract,
same :class:`StreamOpenError` reasons, no tunnel. A node maps to a host (name or address) that is
dialled with ``asyncio.open_connection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Collection, Mapping

from raven.protocol.codes import StreamCode
from raven.protocol.names import normalize_node_name
from raven.transport.stream import ByteStream, OpenFailure, StreamOpenError, StreamResetError

_UNREACHABLE_ERRNOS = {
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EHOSTDOWN,
    errno.ENETDOWN,
    errno.EADDRNOTAVAIL,
}


def _failure_of(exc: OSError) -> OpenFailure:
    """Refused or unreachable; a multi-address connect reports ``errno`` None with the text."""
    if exc.errno in _UNREACHABLE_ERRNOS:
        return OpenFailure.TARGET_UNREACHABLE
    if exc.errno == errno.ECONNREFUSED or "refused" in str(exc).lower():
        return OpenFailure.TARGET_REFUSED
    return OpenFailure.TARGET_UNREACHABLE


class DirectStream:
    """A :class:`ByteStream` over an asyncio stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._reset: StreamResetError | None = None
        self._eof_read = False
        self._eof_written = False

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self._reset is not None:
            raise self._reset
        try:
            data = await self._reader.read(max_bytes)
        except OSError as exc:
            self._reset = StreamResetError(StreamCode.TARGET_RESET, str(exc) or type(exc).__name__)
            raise self._reset from None
        if self._reset is not None:
            raise self._reset
        if not data:
            self._eof_read = True
        return data

    async def write(self, data: bytes) -> None:
        if self._reset is not None:
            raise self._reset
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as exc:
            self._reset = StreamResetError(StreamCode.TARGET_RESET, str(exc) or type(exc).__name__)
            raise self._reset from None

    async def write_eof(self) -> None:
        if self._reset is not None:
            raise self._reset
        if self._eof_written:
            return
        self._eof_written = True
        try:
            if self._writer.can_write_eof():
                self._writer.write_eof()
        except OSError as exc:
            self._reset = StreamResetError(StreamCode.TARGET_RESET, str(exc) or type(exc).__name__)
            raise self._reset from None

    def reset(self, code: StreamCode, reason: str = "") -> None:
        if self._reset is None:
            self._reset = StreamResetError(code, reason)
        self._writer.transport.abort()

    async def aclose(self) -> None:
        transport = self._writer.transport
        if self._reset is not None:
            transport.abort()
            return
        transport.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class DirectOpener:
    """:class:`StreamOpener` by plain TCP to ``nodes[node]``.

    ``allowed_ports``: None allows every port. ``connect_timeout_s`` bounds the TCP connect
    (further bounded by the caller's ``timeout_s``).
    """

    def __init__(
        self,
        nodes: Mapping[str, str],
        allowed_ports: Collection[int] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._nodes = {normalize_node_name(k): v for k, v in nodes.items()}
        self._ports = None if allowed_ports is None else frozenset(allowed_ports)
        self._connect_timeout_s = connect_timeout_s

    async def open_stream(self, node: str, port: int, *, timeout_s: float) -> ByteStream:
        name = normalize_node_name(node)
        address = self._nodes.get(name)
        if address is None:
            raise StreamOpenError(OpenFailure.UNKNOWN_NODE, f"no such node {name}")
        if self._ports is not None and port not in self._ports:
            raise StreamOpenError(OpenFailure.PORT_NOT_ALLOWED, f"port {port} is not allowed")
        timeout = max(0.0, min(timeout_s, self._connect_timeout_s))
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(address, port)
        except TimeoutError:
            raise StreamOpenError(
                OpenFailure.TARGET_TIMEOUT, f"connect to {name}:{port} timed out after {timeout}s"
            ) from None
        except ConnectionRefusedError:
            raise StreamOpenError(
                OpenFailure.TARGET_REFUSED, f"{name}:{port} refused the connection"
            ) from None
        except socket.gaierror as exc:
            raise StreamOpenError(
                OpenFailure.TARGET_UNREACHABLE, f"cannot resolve {address}: {exc.strerror}"
            ) from None
        except OSError as exc:
            failure = _failure_of(exc)
            raise StreamOpenError(failure, f"{name}:{port}: {exc.strerror or exc}") from None
        return DirectStream(reader, writer)
