"""The tunnel over WebSocket: an asyncio transport that carries the tunnel's bytes in binary
frames over another transport (TCP, or TLS to a load balancer).

:class:`WebSocketTransport` is what the :class:`~raven.transport.tunnel.Tunnel` writes to
(each write one frame, masked on the client's side); :class:`WebSocketReceiver` is the
protocol of the transport underneath: it reads frames (:class:`raven.protocol.websocket.
FrameReader`), hands the stream bytes to the tunnel, answers pings and closes. Flow control
passes straight through (pause/resume reading and writing, write-buffer limits).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raven.protocol import websocket as ws
from raven.telemetry.logs import fields
from raven.transport.read_buffer import CopyingReader

log = logging.getLogger(__name__)


class WebSocketTransport(asyncio.Transport):
    """The tunnel's side: writes become binary frames on ``inner``."""

    def __init__(
        self,
        inner: asyncio.Transport,
        protocol: asyncio.Protocol,
        *,
        client: bool,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._info = dict(extra or {})
        self._inner = inner
        self._protocol = protocol
        self._client = client
        self._closing = False

    # writing
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data and not self._closing:
            self._inner.write(ws.encode_frame(data, mask_key=self._key()))

    def _key(self) -> bytes | None:
        """A fresh masking key per frame on the client's side (RFC 6455 5.3), else None."""
        return os.urandom(4) if self._client else None

    def writelines(self, list_of_data: typing.Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    # reading
    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    # lifetime
    def close(self) -> None:
        """A CLOSE frame (going away), then the connection underneath is closed."""
        if self._closing:
            return
        self._closing = True
        if not self._inner.is_closing():
            frame = ws.encode_frame(
                ws.close_payload(ws.CLOSE_GOING_AWAY), opcode=ws.CLOSE, mask_key=self._key()
            )
            self._inner.write(frame)
            self._inner.close()

    def abort(self) -> None:
        self._closing = True
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._closing or self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in self._info:
            return self._info[name]
        return self._inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = typing.cast(asyncio.Protocol, protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol


class WebSocketReceiver(CopyingReader):
    """The transport underneath's protocol: frames in, stream bytes to the tunnel. A
    CopyingReader: the standard library's TCP and TLS transports read into the thread's
    buffer, not a fresh 256 KiB one per read (raven.transport.read_buffer)."""

    def __init__(self, transport: WebSocketTransport, inner: asyncio.Transport, *, client: bool):
        self.transport = transport
        self.inner = inner
        self.client = client
        # a client reads a server's (unmasked) frames, a server a client's (masked)
        self.reader = ws.FrameReader(masked=not client)

    @property
    def app(self) -> asyncio.Protocol:
        return typing.cast(asyncio.Protocol, self.transport.get_protocol())

    def data_received(self, data: bytes) -> None:
        try:
            chunks, controls = self.reader.feed(data)
        except ws.WebSocketError as exc:
            log.warning(
                "websocket framing broken, closing",
                extra=fields(peer=self._peer(), reason=str(exc)),
            )
            self.inner.abort()
            return
        if chunks:
            self.app.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        for control in controls:
            if control.opcode == ws.PING and not self.inner.is_closing():
                pong = ws.encode_frame(
                    control.payload, opcode=ws.PONG, mask_key=os.urandom(4) if self.client else None
                )
                self.inner.write(pong)
            elif control.opcode == ws.CLOSE:
                # the peer is going away: the tunnel sees the end of its byte stream
                self.transport.close()
                self.app.eof_received()

    def _peer(self) -> str:
        peer = self.inner.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def eof_received(self) -> bool | None:
        return self.app.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.app.connection_lost(exc)

    def pause_writing(self) -> None:
        self.app.pause_writing()

    def resume_writing(self) -> None:
        self.app.resume_writing()


def compiled_mask() -> Callable[[bytes, bytearray], None] | None:
    """aiohttp's compiled masking loop, loaded from its extension file without importing the
    aiohttp package (a `wss://` agent would carry ~13 MiB of it for this one loop; the module
    alone is 0.4 MiB); None where it is not installed as an extension (then the pure-Python
    mask of raven.protocol.websocket serves)."""
    helpers = sys.modules.get("aiohttp._websocket.helpers")
    if helpers is not None:  # the gateway loads aiohttp anyway
        return getattr(helpers, "websocket_mask", None)
    try:
        spec = importlib.util.find_spec("aiohttp")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    for path in sorted(Path(spec.origin).parent.joinpath("_websocket").glob("mask.*")):
        if path.suffix not in (".so", ".pyd"):
            continue
        module_spec = importlib.util.spec_from_file_location("aiohttp._websocket.mask", path)
        if module_spec is None or module_spec.loader is None:
            return None
        try:
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        except ImportError:
            return None
        fn = getattr(module, "_websocket_mask_cython", None)
        return fn if callable(fn) else None
    return None


@functools.cache
def install_mask() -> None:
    """Use the compiled mask from the first WebSocket on (a plain agent never loads it)."""
    fn = compiled_mask()
    if fn is not None:
        ws.MASKER.impl = fn


def stack_websocket(
    inner: asyncio.Transport,
    app: asyncio.Protocol,
    *,
    client: bool,
    first_bytes: bytes = b"",
    extra: dict[str, Any] | None = None,
) -> WebSocketTransport:
    """Put ``app`` (a Tunnel) on a WebSocket over ``inner``: ``app.connection_made`` is
    called with the WebSocket transport, then fed ``first_bytes`` (frames that arrived with
    the end of the opening handshake)."""
    install_mask()
    transport = WebSocketTransport(inner, app, client=client, extra=extra)
    receiver = WebSocketReceiver(transport, inner, client=client)
    inner.set_protocol(receiver)
    app.connection_made(transport)
    if first_bytes and not transport.is_closing():
        receiver.data_received(first_bytes)
    return transport
