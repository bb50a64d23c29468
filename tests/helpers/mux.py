"""Two multiplexers back to back with no records or sockets (the multiplexer's unit tests)."""

from __future__ import annotations

from raven.protocol.constants import MAX_RECORD_PAYLOAD_BYTES
from raven.protocol.events import (
    Event,
    StreamAccepted,
    StreamDataReceived,
    StreamOpened,
    StreamWindowOpened,
)
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from tests.helpers.sansio import events

LIMITS = Limits(stream_window_bytes=64 * 1024, max_frame_payload_bytes=16 * 1024)


def feed(mux: Multiplexer, payload: bytes, now: float) -> None:
    """receive_payload, then resume_input until no frame waits (an adapter's later turns)."""
    mux.receive_payload(payload, now)
    while mux.backlog.pending:
        mux.resume_input(now)


class Pair:
    """An agent-side (initiator) and a gateway-side (responder) multiplexer."""

    def __init__(self, limits: Limits = LIMITS, gateway_limits: Limits | None = None) -> None:
        self.now = 0.0
        self.agent = Multiplexer(initiator=True, limits=limits, now=self.now)
        self.gateway = Multiplexer(initiator=False, limits=gateway_limits or limits, now=self.now)
        self.agent.confirm(self.now)
        self.gateway.confirm(self.now)
        self.payloads = {id(self.agent): 0, id(self.gateway): 0}

    def flush(self, src: Multiplexer, dst: Multiplexer, max_payloads: int | None = None) -> int:
        count = 0
        while max_payloads is None or count < max_payloads:
            payload = src.next_payload()
            if payload is None:
                break
            assert len(payload) <= MAX_RECORD_PAYLOAD_BYTES
            feed(dst, payload, self.now)
            count += 1
        self.payloads[id(src)] += count
        return count

    def pump(self) -> None:
        for _ in range(10_000):
            if not self.flush(self.agent, self.gateway) + self.flush(self.gateway, self.agent):
                return
        raise AssertionError("pump did not settle")

    def open(self, node: str = "edge-gpu-1", port: int = 9400) -> int:
        """Gateway opens a stream, agent accepts; events drained."""
        stream_id = self.gateway.open_stream(node, port)
        self.pump()
        assert events(self.agent) == [StreamOpened(stream_id, node, port)]
        self.agent.accept_stream(stream_id)
        self.pump()
        assert events(self.gateway) == [StreamAccepted(stream_id), StreamWindowOpened(stream_id)]
        assert events(self.agent) == []  # the opener's grant came with its OPEN
        assert self.agent.send_capacity(stream_id) > 0
        return stream_id


def received(evs: list[Event], stream_id: int) -> bytes:
    return b"".join(
        e.data for e in evs if isinstance(e, StreamDataReceived) and e.stream_id == stream_id
    )
