"""The REPLICA exchange of one tunnel (docs/protocol.md, "Gateway replicas"): the agent asks
which gateway replica its tunnel reached; the gateway answers with its id and the replica
count, and again whenever the count changes. Each side accepts only the other side's half."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import ReplicaAnnounced, ReplicaAsked
from raven.protocol.frames import ReplicaFrame, encode_frame

__all__ = ["ReplicaExchange"]


class ReplicaExchange:
    """``send`` queues a control frame; ``send_reply`` a peer-induced one (bounded like a
    PONG: an agent that keeps asking without reading gets its tunnel closed)."""

    __slots__ = ("_initiator", "_send", "_send_reply", "asked")

    def __init__(
        self,
        initiator: bool,
        send: Callable[[bytes], None],
        send_reply: Callable[[Iterable[bytes]], None],
    ) -> None:
        self._initiator = initiator
        self._send = send
        self._send_reply = send_reply
        #: (gateway) the agent asked: it understands REPLICA and gets the count's changes
        self.asked = False

    def receive(self, frame: ReplicaFrame) -> ReplicaAsked | ReplicaAnnounced:
        """The event a received REPLICA frame makes; RemoteProtocolError for the wrong half."""
        if frame.is_question == self._initiator:
            raise RemoteProtocolError(
                "REPLICA question sent to the agent"
                if self._initiator
                else "REPLICA announcement sent to the gateway"
            )
        if self._initiator:
            return ReplicaAnnounced(frame.replica_id, frame.replicas)
        self.asked = True
        return ReplicaAsked()

    def ask(self) -> None:
        """(agent) Ask which replica this is: ReplicaAnnounced answers."""
        if not self._initiator:
            raise LocalProtocolError("only the initiator (agent) asks which replica it reached")
        self._send(encode_frame(ReplicaFrame()))

    def announce(self, replica_id: str, replicas: int) -> None:
        """(gateway) Tell an agent that asked (``asked``) which replica this is and how many
        there are; again whenever the count changes."""
        if self._initiator or not self.asked:
            raise LocalProtocolError("only the gateway announces, and only to an agent that asked")
        self._send_reply([encode_frame(ReplicaFrame(replica_id, replicas))])
