"""Byte relay for CONNECT and the TLS listener: both directions, half-close kept, TLS untouched.

The client connection is joined to the stream by the one splice (`raven.transport.splice`):
bytes move by callbacks, the request's task only awaits the end. The splice ends when both
directions have ended (both sides closed), when either side breaks, or after
``idle_timeout_s`` with no byte in either direction (the stream reset, the client cut).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from cloud_gateway.proxy.context import ProxyContext
from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.proxy.target import Target
from raven.telemetry.logs import fields
from raven.transport.splice import SpliceEnd
from raven.transport.stream import ByteStream, StreamResetError

if TYPE_CHECKING:
    from cloud_gateway.proxy.client_conn import ClientConnection

log = logging.getLogger("cloud_gateway.proxy")


async def relay(
    ctx: ProxyContext, client: ClientConnection, stream: ByteStream, *, target: Target
) -> None:
    """Relay until done; what the client sent past its request (or ClientHello) goes first."""
    peer = client.peer
    splice = client.splice_to(stream, idle_timeout_s=ctx.config.idle_timeout_s)
    try:
        result = await asyncio.shield(splice.done)
    except asyncio.CancelledError:  # shutdown past its grace: never leave either side open
        splice.close()
        raise
    if result.end is SpliceEnd.DONE:
        client.close()
    else:
        client.abort()
    ctx.metrics.response_bytes += result.to_socket_bytes
    if result.end is SpliceEnd.IDLE:
        log.debug("relay idle mode=%s node=%s peer=%s", target.mode.value, target.node, peer)
    failed = result.error
    if isinstance(failed, StreamResetError):
        ctx.metrics.error(ErrorKind.TARGET_RESET)
        log.info(
            "relay reset",
            extra=fields(mode=target.mode.value, node=target.node, peer=peer,
                         reason=failed.code.label),
        )  # fmt: skip
