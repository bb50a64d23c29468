"""OPEN carrying the stream's first bytes: wire form, bounds and exact credit accounting."""

from __future__ import annotations

import struct

import pytest

from raven.config.common import LimitsConfig
from raven.protocol.codes import StreamCode
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import (
    StreamAccepted,
    StreamOpened,
    StreamRefused,
    StreamReset,
    StreamWindowOpened,
)
from raven.protocol.frames import (
    FLAG_OPEN_DATA,
    MAX_OPEN_DATA_BYTES,
    FrameType,
    OpenFrame,
    encode_frame,
    parse_frames,
)
from raven.protocol.limits import Limits
from tests.helpers.mux import LIMITS, Pair, received
from tests.helpers.sansio import events

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: edge-gpu-1:9400\r\n\r\n"


def test_open_frame_with_data_round_trips() -> None:
    frame = OpenFrame(7, "edge-gpu-1", 9400, REQUEST)
    raw = encode_frame(frame)
    assert raw[1] == FLAG_OPEN_DATA
    assert parse_frames(raw) == [frame]
    plain = OpenFrame(7, "edge-gpu-1", 9400)  # without data: the flag is off, the form unchanged
    assert encode_frame(plain)[1] == 0 and parse_frames(encode_frame(plain)) == [plain]


def test_oversize_open_data_is_refused_both_ways() -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(OpenFrame(1, "edge-gpu-1", 9400, b"x" * (MAX_OPEN_DATA_BYTES + 1)))
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.gateway.open_stream("edge-gpu-1", 9400, b"x" * (MAX_OPEN_DATA_BYTES + 1))
    node = b"edge-gpu-1"
    body = struct.pack(">HB", 9400, len(node)) + node + b"x" * (MAX_OPEN_DATA_BYTES + 1)
    header = struct.pack(">BBIH", FrameType.OPEN, FLAG_OPEN_DATA, 2, len(body))
    with pytest.raises(RemoteProtocolError):
        parse_frames(header + body)


@pytest.mark.parametrize(
    "body",
    [
        struct.pack(">HB", 9400, 10) + b"edge-gpu-1",  # the flag but no data
        struct.pack(">HB", 9400, 0) + b"data",  # no node name
        struct.pack(">HB", 9400, 40) + b"edge-gpu-1",  # the name runs past the frame
    ],
)
def test_malformed_open_data_is_a_protocol_error(body: bytes) -> None:
    header = struct.pack(">BBIH", FrameType.OPEN, FLAG_OPEN_DATA, 2, len(body))
    with pytest.raises(RemoteProtocolError):
        parse_frames(header + body)


def test_request_arrives_with_the_open_in_one_payload() -> None:
    pair = Pair()
    stream_id = pair.gateway.open_stream("edge-gpu-1", 9400, REQUEST)
    assert pair.flush(pair.gateway, pair.agent) == 1  # OPEN (with the request) and its CREDIT
    evs = events(pair.agent)
    assert evs[0] == StreamOpened(stream_id, "edge-gpu-1", 9400)
    assert received(evs, stream_id) == REQUEST
    assert pair.agent.buffered_bytes == len(REQUEST)


def test_open_data_counts_against_the_window_exactly() -> None:
    pair = Pair()
    window = LIMITS.stream_window_bytes
    stream_id = pair.gateway.open_stream("edge-gpu-1", 9400, REQUEST)
    assert pair.gateway.send_capacity(stream_id) == 0  # nothing more before the answer
    pair.pump()
    events(pair.agent)
    pair.agent.accept_stream(stream_id)
    pair.pump()
    assert events(pair.gateway) == [StreamAccepted(stream_id), StreamWindowOpened(stream_id)]
    # the agent's grant covers the OPEN's data: the rest of the window is left, not more
    assert pair.gateway.send_capacity(stream_id) == window - len(REQUEST)
    rest = b"y" * (window - len(REQUEST))
    pair.gateway.send_stream_data(stream_id, rest)
    with pytest.raises(LocalProtocolError):
        pair.gateway.send_stream_data(stream_id, b"z")
    pair.pump()
    evs = events(pair.agent)
    assert not [e for e in evs if isinstance(e, StreamReset)]  # within the window: no reset
    assert received(evs, stream_id) == rest
    assert pair.agent.buffered_bytes == window
    # consuming everything (the OPEN's bytes included) gives the whole window back
    pair.agent.consume_stream_data(stream_id, window)
    pair.pump()
    assert pair.gateway.send_capacity(stream_id) == window


def test_consumed_before_accept_is_granted_after() -> None:
    limits = Limits(stream_window_bytes=16 * 1024, max_frame_payload_bytes=16 * 1024)
    pair = Pair(limits)
    data = b"q" * (8 * 1024)  # over credit_update_ratio of the window: a CREDIT is due
    stream_id = pair.gateway.open_stream("edge-gpu-1", 9400, data)
    pair.pump()
    events(pair.agent)
    pair.agent.consume_stream_data(stream_id, len(data))  # read before the accept
    pair.pump()
    assert events(pair.gateway) == []  # no CREDIT before OPEN_RESULT
    pair.agent.accept_stream(stream_id)
    pair.pump()
    assert pair.gateway.send_capacity(stream_id) == limits.stream_window_bytes - len(data)
    pair.agent.consume_stream_data(stream_id, 0)  # the next consumption grants them back
    pair.pump()
    assert pair.gateway.send_capacity(stream_id) == limits.stream_window_bytes


def test_open_data_beyond_the_window_is_refused() -> None:
    small = Limits(stream_window_bytes=4 * 1024, max_frame_payload_bytes=16 * 1024)
    pair = Pair(small, gateway_limits=LIMITS)  # the agent, which accepts, has small windows
    stream_id = pair.gateway.open_stream("edge-gpu-1", 9400, b"x" * (8 * 1024))
    pair.pump()
    assert pair.gateway.stream_state(stream_id) is None  # refused, forgotten
    assert events(pair.agent) == []
    assert pair.agent.buffered_bytes == 0
    evs = events(pair.gateway)
    assert [type(e) for e in evs] == [StreamRefused]
    assert isinstance(evs[0], StreamRefused) and evs[0].code is StreamCode.PROTOCOL_ERROR


def test_refused_open_releases_its_data() -> None:
    pair = Pair()
    stream_id = pair.gateway.open_stream("edge-gpu-1", 9400, REQUEST)
    pair.pump()
    events(pair.agent)
    assert pair.agent.buffered_bytes == len(REQUEST)
    pair.agent.refuse_stream(stream_id, StreamCode.UNKNOWN_NODE, "not here")
    pair.pump()
    assert pair.agent.buffered_bytes == 0 and pair.agent.open_streams == 0
    assert events(pair.gateway) == [StreamRefused(stream_id, StreamCode.UNKNOWN_NODE, "not here")]


def test_configured_stream_windows_hold_any_open_data() -> None:
    assert LimitsConfig(stream_window_bytes=MAX_OPEN_DATA_BYTES).stream_window_bytes
    with pytest.raises(ValueError, match="stream_window_bytes"):
        LimitsConfig(stream_window_bytes=MAX_OPEN_DATA_BYTES - 1)
