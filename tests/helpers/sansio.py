"""Driving sans-IO tunnel connections back to back, with no sockets (unit tests)."""

from __future__ import annotations

from raven.protocol.connection import TunnelConnection
from raven.protocol.events import Event, StreamAccepted, StreamOpened
from raven.protocol.mux import Multiplexer


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
