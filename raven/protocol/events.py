"""Events a tunnel connection emits: frozen, past-tense dataclasses (after aioquic).

The asyncio adapter drains them with ``TunnelConnection.next_event()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raven.protocol.codes import CloseCode, StreamCode


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every tunnel event."""


@dataclass(frozen=True, slots=True)
class HandshakeCompleted(Event):
    """Both sides hold transport keys. ``remote_static`` is the peer's X25519 public key."""

    remote_static: bytes


@dataclass(frozen=True, slots=True)
class CookieReplied(Event):
    """The gateway was under handshake load: it sent a cookie reply instead of a
    Diffie-Hellman (responder), or one was accepted and message 1 went again with mac2
    (initiator)."""


@dataclass(frozen=True, slots=True)
class StreamOpened(Event):
    """The peer asks to open ``stream_id`` to ``node``:``port``; answer with
    ``accept_stream`` or ``refuse_stream``."""

    stream_id: int
    node: str
    port: int


@dataclass(frozen=True, slots=True)
class StreamAccepted(Event):
    """A stream we opened was accepted; data may flow both ways."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamRefused(Event):
    """A stream we opened was refused by the peer (or locally, e.g. BUSY)."""

    stream_id: int
    code: StreamCode
    reason: str


@dataclass(frozen=True, slots=True)
class StreamDataReceived(Event):
    """Bytes for ``stream_id``. Call ``consume_stream_data(stream_id, len(data))``
    once the application has actually read them, so credit flows back."""

    stream_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamWindowOpened(Event):
    """The peer granted credit: ``send_capacity(stream_id)`` grew."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamEnded(Event):
    """The peer half-closed ``stream_id``: no more data will arrive on it."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset(Event):
    """``stream_id`` was aborted (by the peer, by a limit, or because the tunnel closed)."""

    stream_id: int
    code: StreamCode
    reason: str
    by_peer: bool


@dataclass(frozen=True, slots=True)
class StreamClosed(Event):
    """Both directions of ``stream_id`` finished cleanly; its state is gone."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class DatagramReceived(Event):
    """One L3 packet from the peer."""

    data: bytes


@dataclass(frozen=True, slots=True)
class RegistrationReceived(Event):
    """(gateway side) The agent announced the node names and IP prefixes it serves.
    The whole set replaces any earlier registration on this tunnel. Answer with
    ``answer_registration``."""

    nodes: tuple[str, ...]
    prefixes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RegistrationAnswered(Event):
    """(agent side) What the gateway made of our registration."""

    accepted_nodes: tuple[str, ...]
    accepted_prefixes: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = field(default=())  # (name or prefix, reason)


@dataclass(frozen=True, slots=True)
class ReplicaAsked(Event):
    """(gateway side) The agent asked which replica it reached: answer with
    ``announce_replica`` (and again whenever the replica count changes)."""


@dataclass(frozen=True, slots=True)
class ReplicaAnnounced(Event):
    """(agent side) The gateway replica this tunnel reached, and how many replicas serve
    the address it dialled."""

    replica_id: str
    replicas: int


@dataclass(frozen=True, slots=True)
class PongReceived(Event):
    """A PONG answered our PING; ``rtt_s`` is the measured round-trip time."""

    rtt_s: float


@dataclass(frozen=True, slots=True)
class GoAwayReceived(Event):
    """The peer is draining: open no new streams on this tunnel."""

    code: CloseCode
    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionTerminated(Event):
    """The tunnel is over. Every open stream was reset (TUNNEL_CLOSED) before this event."""

    code: CloseCode
    reason: str
    by_peer: bool
