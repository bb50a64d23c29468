"""One client connection on a TLS passthrough listener: route by SNI, relay bytes untouched.

The ClientHello must arrive within ``header_timeout_s``. Routing failures answer with a fatal TLS
alert (``unrecognized_name`` for names that are not routable nodes, ``handshake_failure``
otherwise) and close; they are counted like HTTP errors with the status they would have had.
"""

from __future__ import annotations

import asyncio
import contextlib

from cloud_gateway.proxy.client_conn import ClientConnection, ConnectionSlots
from cloud_gateway.proxy.context import READ_BYTES, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind, ProxyError
from cloud_gateway.proxy.exchange import open_target
from cloud_gateway.proxy.relay import relay
from cloud_gateway.proxy.sni import (
    ALERT_HANDSHAKE_FAILURE,
    ALERT_UNRECOGNIZED_NAME,
    MAX_CLIENT_HELLO_BYTES,
    extract_sni,
    tls_alert,
)
from cloud_gateway.proxy.target import Mode, Target, check_node

_NAME_ERRORS = frozenset(
    {ErrorKind.UNKNOWN_NODE, ErrorKind.IP_LITERAL, ErrorKind.BAD_TARGET, ErrorKind.NO_AGENT}
)


class TlsConnection(ClientConnection):
    """One connection on a TLS listener: its one task reads the ClientHello, then relays."""

    def __init__(self, ctx: ProxyContext, slots: ConnectionSlots, target_port: int) -> None:
        super().__init__(ctx, slots)
        self.target_port = target_port

    def start(self) -> None:
        self.spawn(serve_tls(self.ctx, self, self.target_port))


async def _read_client_hello(conn: ClientConnection) -> tuple[str, bytes] | None:
    """(server name, bytes read) or None on EOF; raises ClientHelloError."""
    data = bytearray()
    while True:
        chunk = await conn.read(READ_BYTES)
        if not chunk:
            return None
        data += chunk
        name = extract_sni(bytes(data), MAX_CLIENT_HELLO_BYTES)
        if name is not None:
            return name, bytes(data)


async def serve_tls(ctx: ProxyContext, conn: ClientConnection, target_port: int) -> None:
    """Serve one TLS passthrough connection to ``<sni>:<target_port>``."""
    with contextlib.ExitStack() as slot:
        await _serve_tls(ctx, conn, target_port, slot)


async def _serve_tls(
    ctx: ProxyContext, conn: ClientConnection, target_port: int, slot: contextlib.ExitStack
) -> None:
    mode = Mode.TLS.value
    node = ""
    try:
        try:
            async with asyncio.timeout(ctx.config.header_timeout_s):
                hello = await _read_client_hello(conn)
        except TimeoutError:
            detail = f"no ClientHello within {ctx.config.header_timeout_s:g}s"
            raise ProxyError(ErrorKind.HEADER_TIMEOUT, detail) from None
        if hello is None:
            conn.close()
            return
        sni, data = hello
        node = check_node(sni)
        target = Target(Mode.TLS, node, target_port)
        slot.enter_context(ctx.admit(conn.client, node))
        stream = await open_target(ctx, target, ctx.config.default_timeout_s)
    except ProxyError as exc:
        ctx.record_error(exc, mode, conn.peer, node)
        alert = ALERT_UNRECOGNIZED_NAME if exc.kind in _NAME_ERRORS else ALERT_HANDSHAKE_FAILURE
        if exc.kind is not ErrorKind.HEADER_TIMEOUT and not conn.is_closing():
            conn.write(tls_alert(alert))
        conn.close()
        return
    except OSError:
        conn.abort()
        return
    ctx.metrics.request(mode, 200)
    conn.buf.unread(data)  # the ClientHello goes first, then what followed it
    await relay(ctx, conn, stream, target=target)
