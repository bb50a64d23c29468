"""Byte relay for CONNECT and the TLS listener: both directions, half-close kept, TLS untouched.

The shared pump (`raven.transport.pump`) moves the bytes; it ends when both directions have
ended, when either side breaks, or after ``idle_timeout_s`` with no byte in either direction.
A clean end closes both sides; any other end resets the stream and aborts the connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cloud_gateway.proxy.context import READ_BYTES, ProxyContext
from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.target import Target
from raven.protocol.codes import StreamCode
from raven.telemetry.logs import fields
from raven.transport.pump import PumpEnd, PumpResult, pump
from raven.transport.stream import ByteStream, StreamResetError

if TYPE_CHECKING:
    from cloud_gateway.proxy.client_conn import ClientConnection

log = logging.getLogger("cloud_gateway.proxy")


async def relay(
    ctx: ProxyContext,
    client: ClientConnection,
    stream: ByteStream,
    *,
    early: bytes,
    target: Target,
) -> None:
    """Relay until done; ``early`` are client bytes already read (sent to the target first)."""
    result: PumpResult | None = None
    peer = client.peer
    try:
        result = await pump(stream, client, client, chunk_bytes=READ_BYTES, early=early,
                            idle_timeout_s=ctx.config.idle_timeout_s)  # fmt: skip
    finally:  # also when cancelled (shutdown): never leave the stream or the client open
        if result is not None and result.end is PumpEnd.DONE:
            stream.close()
            client.close()
        else:
            stream.reset(StreamCode.CANCELLED, "relay ended")
            stream.close()
            client.abort()
    ctx.metrics.response_bytes += result.to_socket_bytes
    if result.end is PumpEnd.IDLE:
        log.debug("relay idle mode=%s node=%s peer=%s", target.mode.value, target.node, peer)
    failed = result.error
    if isinstance(failed, StreamResetError):
        ctx.metrics.error(ErrorKind.TARGET_RESET)
        log.info(
            "relay reset",
            extra=fields(mode=target.mode.value, node=target.node, peer=peer,
                         reason=failed.code.label),
        )  # fmt: skip
