"""The REPLICA frame (docs/protocol.md, "Gateway replicas"): the agent asks which gateway
replica its tunnel reached, the gateway answers with its id and the replica count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import ConnectionTerminated, ReplicaAnnounced, ReplicaAsked
from raven.protocol.frames import HEADER, FrameType, ReplicaFrame, encode_frame, parse_frames
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from raven.protocol.names import MAX_REPLICA_ID_BYTES, replica_id_error
from tests.helpers.sansio import events


class Pair:
    """An agent-side and a gateway-side multiplexer, confirmed, back to back."""

    def __init__(self) -> None:
        self.agent = Multiplexer(initiator=True, limits=Limits(), now=0.0)
        self.gateway = Multiplexer(initiator=False, limits=Limits(), now=0.0)
        self.agent.confirm(0.0)
        self.gateway.confirm(0.0)

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for src, dst in ((self.agent, self.gateway), (self.gateway, self.agent)):
                while (payload := src.next_payload()) is not None:
                    dst.receive_payload(payload, 0.0)
                    moved = True


def test_question_and_answer_round_trip() -> None:
    assert parse_frames(encode_frame(ReplicaFrame())) == [ReplicaFrame()]
    answer = ReplicaFrame("raven-gateway-7d9f-abcde", 3)
    wire = encode_frame(answer)
    assert wire[:1] == bytes([FrameType.REPLICA]) and parse_frames(wire) == [answer]


@pytest.mark.parametrize(
    "body",
    [b"\x00\x00gw-1", b"\x00\x03", b"\x00\x03bad id", b"\x00\x03gw\nx", b"\x00"],
)
def test_bad_announcements_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_frames(HEADER.pack(FrameType.REPLICA, 0, 0, len(body)) + body)


def test_replica_frame_on_a_stream_is_refused() -> None:
    with pytest.raises(RemoteProtocolError):
        parse_frames(HEADER.pack(FrameType.REPLICA, 0, 5, 0))


@given(st.binary(max_size=300))
def test_any_body_parses_or_is_a_protocol_error(body: bytes) -> None:
    try:
        (frame,) = parse_frames(HEADER.pack(FrameType.REPLICA, 0, 0, len(body)) + body)
    except RemoteProtocolError:
        return
    assert isinstance(frame, ReplicaFrame)
    assert frame.is_question or replica_id_error(frame.replica_id) is None


def test_replica_ids() -> None:
    assert replica_id_error("raven-gateway-0") is None
    assert replica_id_error("a" * MAX_REPLICA_ID_BYTES) is None
    assert replica_id_error("") is not None
    assert replica_id_error("a" * (MAX_REPLICA_ID_BYTES + 1)) is not None
    assert replica_id_error("gw 1") is not None
    with pytest.raises(LocalProtocolError):
        encode_frame(ReplicaFrame("gw 1", 2))
    with pytest.raises(LocalProtocolError):
        encode_frame(ReplicaFrame("gw-1", 0))


def test_agent_asks_gateway_answers_and_tells_count_changes() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.gateway.replica.announce("gw-1", 3)  # nobody asked
    pair.agent.replica.ask()
    pair.pump()
    assert events(pair.gateway) == [ReplicaAsked()]
    assert pair.gateway.replica.asked
    pair.gateway.replica.announce("gw-1", 3)
    pair.pump()
    assert events(pair.agent) == [ReplicaAnnounced("gw-1", 3)]
    pair.gateway.replica.announce("gw-1", 4)
    pair.pump()
    assert events(pair.agent) == [ReplicaAnnounced("gw-1", 4)]


def test_wrong_direction_is_a_protocol_error() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.gateway.replica.ask()
    with pytest.raises(RemoteProtocolError, match="question sent to the agent"):
        pair.agent.receive_payload(encode_frame(ReplicaFrame()), 0.0)
    with pytest.raises(RemoteProtocolError, match="announcement sent to the gateway"):
        pair.gateway.receive_payload(encode_frame(ReplicaFrame("gw-1", 2)), 0.0)
    assert not [e for e in events(pair.agent) if isinstance(e, ConnectionTerminated)]
