"""Driving sans-IO tunnel connections back to back, with no sockets (unit tests)."""

from __future__ import annotations

import time

from raven.protocol.connection import Role, TunnelConnection
from raven.protocol.events import Event, HandshakeCompleted, StreamAccepted, StreamOpened
from raven.protocol.handshake import ReplayGuard
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from raven.protocol.noise import generate_keypair
from raven.protocol.secure_channel import SecureChannel


def initiator(
    private: bytes, gateway_public: bytes, limits: Limits, wall_time_ns: int | None = None
) -> TunnelConnection:
    """An agent's connection as a real agent makes one: its key, the gateway's public key and
    the real clocks (``wall_time_ns``: another handshake timestamp, e.g. an old one)."""
    return TunnelConnection(
        SecureChannel(
            role=Role.INITIATOR,
            static_private=private,
            remote_static=gateway_public,
            limits=limits,
            now=time.monotonic(),
            wall_time_ns=time.time_ns() if wall_time_ns is None else wall_time_ns,
        )
    )


def holds_aead(conn: TunnelConnection) -> bool:
    """Either direction of ``conn`` holds its AEAD object (TunnelConnection.trim drops both)."""
    channel = conn._channel
    assert channel._sender is not None and channel._receiver is not None
    return channel._sender._cipher._aead is not None or channel._receiver._cipher._aead is not None


def events(source: TunnelConnection | Multiplexer) -> list[Event]:
    """Every event queued on a TunnelConnection or Multiplexer, oldest first."""
    take = source.events.popleft if isinstance(source, Multiplexer) else source.next_event
    out: list[Event] = []
    while (event := take()) is not None:
        out.append(event)
    return out


def pump(a: TunnelConnection, b: TunnelConnection, now: float = 0.0) -> None:
    """Move wire bytes both ways until neither side has any to send."""
    for _ in range(10_000):
        x, y = a.data_to_send(), b.data_to_send()
        if not x and not y:
            return
        if x:
            b.receive_data(x, now)
        if y:
            a.receive_data(y, now)
    raise AssertionError("pump did not settle")


def open_stream(agent: TunnelConnection, gateway: TunnelConnection) -> int:
    """The gateway opens a stream to edge-gpu-1:9400 and the agent accepts it."""
    sid = gateway.open_stream("edge-gpu-1", 9400)
    pump(agent, gateway)
    assert events(agent) == [StreamOpened(sid, "edge-gpu-1", 9400)]
    agent.accept_stream(sid)
    pump(agent, gateway)
    assert events(gateway)[0] == StreamAccepted(sid)
    return sid


T0_NS = 1_790_000_000 * 10**9
AGENT_PRIV, AGENT_PUB = generate_keypair()
GW_PRIV, GW_PUB = generate_keypair()
LIMITS = Limits(stream_window_bytes=256 * 1024)


def make_agent(
    limits: Limits = LIMITS,
    now: float = 0.0,
    gateway_pub: bytes = GW_PUB,
    wall_time_ns: int = T0_NS,
) -> TunnelConnection:
    return TunnelConnection(
        SecureChannel(
            role=Role.INITIATOR,
            static_private=AGENT_PRIV,
            limits=limits,
            now=now,
            remote_static=gateway_pub,
            wall_time_ns=wall_time_ns,
        )
    )


def make_gateway(
    limits: Limits = LIMITS, now: float = 0.0, replay_guard: ReplayGuard | None = None
) -> TunnelConnection:
    return TunnelConnection(
        SecureChannel(
            role=Role.RESPONDER,
            static_private=GW_PRIV,
            limits=limits,
            now=now,
            authorize=lambda key: key == AGENT_PUB,
            replay_guard=replay_guard,
        )
    )


def connected(limits: Limits = LIMITS) -> tuple[TunnelConnection, TunnelConnection]:
    agent, gateway = make_agent(limits), make_gateway(limits)
    pump(agent, gateway)
    assert events(agent) == [HandshakeCompleted(GW_PUB)]
    assert events(gateway) == [HandshakeCompleted(AGENT_PUB)]
    return agent, gateway
