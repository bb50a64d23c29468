"""A record of exactly one DATA frame (a stream's bulk, a record at a time) is acted on as it
is read, without Frame objects or the frame backlog (``frames.lone_data``,
``Multiplexer.receive_payload``). It must be invisible: the same verdict as the generic parser
for every payload, the same events and counters, and never ahead of frames that wait before it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.errors import RemoteProtocolError
from raven.protocol.events import (
    StreamAccepted,
    StreamDataReceived,
    StreamOpened,
    StreamWindowOpened,
)
from raven.protocol.frames import (
    HEADER,
    DataFrame,
    FrameType,
    PingFrame,
    encode_frame,
    lone_data,
    parse_frames,
)
from raven.protocol.lifecycle import TunnelState
from tests.helpers.sansio import connected, events, pump

DATA = int(FrameType.DATA)


def generic_verdict(payload: bytes) -> tuple[int, bytes] | None:
    """What the generic parser makes of ``payload``, as lone_data would say it."""
    try:
        frames = parse_frames(payload)
    except RemoteProtocolError:
        return None
    if len(frames) == 1 and isinstance(frames[0], DataFrame):
        return frames[0].stream_id, frames[0].data
    return None


frame_headers = st.builds(
    HEADER.pack,
    st.sampled_from([DATA, DATA, DATA, int(FrameType.DATAGRAM), int(FrameType.CREDIT), 0, 255]),
    st.sampled_from([0, 0, 0, 1, 0x80]),
    st.sampled_from([0, 1, 7, 2**32 - 1]),
    st.integers(0, 80),
)
payloads = st.one_of(
    st.binary(max_size=120),
    st.builds(lambda h, b: h + b, frame_headers, st.binary(max_size=100)),
    st.builds(
        lambda h1, b1, h2, b2: h1 + b1 + h2 + b2,
        frame_headers,
        st.binary(max_size=40),
        frame_headers,
        st.binary(max_size=40),
    ),
)


@given(payloads)
def test_lone_data_says_what_the_generic_parser_says(payload: bytes) -> None:
    assert lone_data(payload) == generic_verdict(payload)


def test_a_lone_data_record_is_one_data_frame_and_nothing_else() -> None:
    frame = encode_frame(DataFrame(5, b"metrics"))
    assert lone_data(frame) == (5, b"metrics")
    assert lone_data(encode_frame(DataFrame(5, b""))) == (5, b"")  # as the parser: no data
    assert (
        lone_data(frame + encode_frame(PingFrame(bytes(8)))) is None
    )  # two frames: the generic path
    assert lone_data(frame[:-1]) is None  # runs short: the parser refuses it
    assert lone_data(HEADER.pack(DATA, 0, 0, 1) + b"x") is None  # stream 0: refused there


def test_lone_data_records_give_the_same_events_and_counters_as_the_generic_path() -> None:
    agent, gateway = connected()
    sid = gateway.open_stream("edge-gpu-1", 9400)
    pump(agent, gateway)
    assert events(agent) == [StreamOpened(sid, "edge-gpu-1", 9400)]
    agent.accept_stream(sid)
    pump(agent, gateway)
    events(gateway)
    before = gateway.stats.frames_received.get("data", 0)
    chunks = [b"a" * 1000, b"b" * 70_000, b"c" * 10]  # the middle one takes two records
    for chunk in chunks:
        agent.send_stream_data(sid, chunk)
        pump(agent, gateway)
    got = events(gateway)
    assert all(isinstance(e, StreamDataReceived) and e.stream_id == sid for e in got)
    assert b"".join(e.data for e in got if isinstance(e, StreamDataReceived)) == b"".join(chunks)
    assert gateway.stats.frames_received["data"] - before == len(got) == 4
    assert gateway.buffered_bytes == sum(map(len, chunks))


def test_a_lone_data_record_never_overtakes_frames_read_before_it() -> None:
    """The agent's OPEN_RESULT and the stream's first DATA record arrive in one read: the
    answer waits in the backlog while the read's records are queued, so the DATA must queue
    behind it (acted on first, it would be data on a stream not yet open: a protocol error)."""
    agent, gateway = connected()
    sid = gateway.open_stream("edge-gpu-1", 9400)
    pump(agent, gateway)
    assert events(agent) == [StreamOpened(sid, "edge-gpu-1", 9400)]
    agent.accept_stream(sid)
    answer = agent.data_to_send()
    agent.send_stream_data(sid, b"HTTP/1.1 200 OK\r\n\r\n")
    response = agent.data_to_send()
    assert answer and response
    before = gateway.stats.frames_received.get("data", 0)
    gateway.receive_data(answer + response, 1.0)
    assert events(gateway) == [
        StreamAccepted(sid),
        StreamWindowOpened(sid),
        StreamDataReceived(sid, b"HTTP/1.1 200 OK\r\n\r\n"),
    ]
    assert gateway.stats.frames_received["data"] == before + 1
    assert gateway.state is not TunnelState.CLOSED
