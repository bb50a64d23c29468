"""Frame encoding and parsing: round trips, every rejection, chunked registration, fuzz."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import FRAME_HEADER_BYTES, MAX_FRAME_PAYLOAD_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.frame_fields import MAX_REASON_BYTES, clean_reason
from raven.protocol.frames import (
    FLAG_FINAL,
    CloseFrame,
    CreditFrame,
    DataFrame,
    DatagramFrame,
    EndFrame,
    Frame,
    FrameType,
    GoAwayFrame,
    OpenFrame,
    OpenResultFrame,
    PingFrame,
    PongFrame,
    RegisterFrame,
    RegisterResultFrame,
    ResetFrame,
    encode_data_header,
    encode_frame,
    encode_header,
    parse_frames,
)
from raven.protocol.registration import encode_register, encode_register_result

SAMPLES: list[Frame] = [
    DataFrame(1, b"hello"),
    DataFrame(7, b""),
    OpenFrame(2, "edge-gpu-7", 9400),
    OpenFrame(4, "node.site-a.example", 10250),
    OpenResultFrame(2, StreamCode.OK),
    OpenResultFrame(2, StreamCode.PORT_NOT_ALLOWED, "port 22 not allowed"),
    CreditFrame(3, 1),
    CreditFrame(3, 0xFFFFFFFF),
    EndFrame(5),
    ResetFrame(5, StreamCode.TARGET_RESET, "connection reset by target"),
    DatagramFrame(b"\x45" + bytes(39)),
    PingFrame(b"12345678"),
    PongFrame(b"87654321"),
    RegisterFrame(("edge-gpu-1", "edge-gpu-2"), ("10.20.0.0/16", "fd00::/64"), True),
    RegisterFrame((), (), False),
    RegisterResultFrame(
        ("edge-gpu-1",), ("10.20.0.0/16",), (("edge-gpu-2", "not authorised"),), True
    ),
    GoAwayFrame(CloseCode.DRAINED, "gateway shutting down"),
    CloseFrame(CloseCode.PROTOCOL_ERROR, "bad frame"),
]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__name__)
def test_round_trip(frame: Frame) -> None:
    wire = encode_frame(frame)
    assert wire[0] == frame.TYPE
    assert struct.unpack(">H", wire[6:8])[0] == len(wire) - FRAME_HEADER_BYTES
    assert parse_frames(wire) == [frame]


def test_several_frames_in_one_payload() -> None:
    wire = b"".join(encode_frame(f) for f in SAMPLES)
    assert parse_frames(wire) == SAMPLES
    assert parse_frames(b"") == []


def test_data_header_matches_encoder() -> None:
    assert encode_data_header(9, 3) + b"abc" == encode_frame(DataFrame(9, b"abc"))


def test_names_are_normalised() -> None:
    wire = encode_frame(OpenFrame(2, "Edge-GPU-7", 80))
    assert parse_frames(wire) == [OpenFrame(2, "edge-gpu-7", 80)]


@pytest.mark.parametrize("name", ["edge-gpu-7.", "123", "site.42", "edge_gpu", "10.0.0.1"])
def test_names_dns_cannot_serve_are_refused_both_ways(name: str) -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(OpenFrame(2, name, 80))
    node = name.encode()
    raw = encode_header(FrameType.OPEN, 0, 2, 2 + len(node)) + struct.pack(">H", 80) + node
    with pytest.raises(RemoteProtocolError, match="invalid node name"):
        parse_frames(raw)


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x00\x00\x00\x00", "truncated frame header"),
        (encode_header(FrameType.DATA, 0, 1, 10) + b"short", "past the end"),
        (encode_header(FrameType.DATA, 0, 0, 0), "bad DATA frame header"),
        (encode_header(FrameType.DATA, 1, 1, 0), "bad DATA frame header"),
        (bytes([200]) + bytes(7), "unknown frame type"),
        (encode_header(FrameType.END, 1, 1, 0), "unknown flags"),
        (encode_header(FrameType.PING, 0, 3, 8) + bytes(8), "bad stream id"),
        (encode_header(FrameType.END, 0, 0, 0), "bad stream id"),
        (encode_header(FrameType.END, 0, 1, 1) + b"x", "END frame with a payload"),
        (encode_header(FrameType.CREDIT, 0, 1, 4) + bytes(4), "CREDIT of zero"),
        (encode_header(FrameType.CREDIT, 0, 1, 3) + bytes(3), "4 bytes"),
        (encode_header(FrameType.PING, 0, 0, 7) + bytes(7), "8 bytes"),
        (encode_header(FrameType.PONG, 0, 0, 9) + bytes(9), "8 bytes"),
        (encode_header(FrameType.DATAGRAM, 0, 0, 0), "empty DATAGRAM"),
        (encode_header(FrameType.OPEN, 0, 1, 2) + b"\x00\x50", "too short"),
        (encode_header(FrameType.OPEN, 0, 1, 5) + b"\x00\x00abc", "port 0"),
        (encode_header(FrameType.OPEN, 0, 1, 6) + b"\x00\x50a\xffc\x00", "not ASCII"),
        (encode_header(FrameType.OPEN, 0, 1, 6) + b"\x00\x50abc\n", "invalid node name"),
        (encode_header(FrameType.OPEN, 0, 1, 10) + b"\x00\x5010.0.0.1", "invalid node name"),
        (encode_header(FrameType.OPEN, 0, 1, 6) + b"\x00\x50-ab-", "invalid node name"),
        (encode_header(FrameType.RESET, 0, 1, 1) + b"\x63", "unknown stream code"),
        (encode_header(FrameType.OPEN_RESULT, 0, 1, 0), "too short"),
        (encode_header(FrameType.CLOSE, 0, 0, 1) + b"\x63", "unknown close code"),
        (encode_header(FrameType.GOAWAY, 0, 0, 0), "too short"),
        (encode_header(FrameType.CLOSE, 0, 0, 257) + bytes(257), "reason longer"),
        (encode_header(FrameType.REGISTER, 0, 0, 1) + b"\x00", "truncated registration"),
        (encode_header(FrameType.REGISTER, 0, 0, 4) + b"\x00\x05ab", "bad registration entry"),
        (encode_header(FrameType.REGISTER, 0, 0, 2) + b"\x00\x00", "bad registration entry"),
        (encode_header(FrameType.REGISTER, 0, 0, 3) + b"\x07\x01a", "unknown registration"),
        (encode_header(FrameType.REGISTER, 0, 0, 3) + b"\x02\x01a", "unknown registration"),
        (encode_header(FrameType.REGISTER, 0, 0, 4) + b"\x01\x02zz", "invalid IP prefix"),
        (encode_header(FrameType.REGISTER, 0, 0, 4) + b"\x01\x02\xff\x00", "not ASCII"),
        (encode_header(FrameType.REGISTER, 0, 0, 4) + b"\x00\x02\xff\x00", "not ASCII"),
        (encode_header(FrameType.REGISTER, 2, 0, 0), "unknown flags"),
        (encode_header(FrameType.REGISTER_RESULT, 0, 0, 3) + b"\x02\x01a", "truncated refused"),
        (encode_header(FrameType.REGISTER_RESULT, 0, 0, 5) + b"\x02\x01a\x05b", "refusal reason"),
    ],
)
def test_rejections(wire: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        parse_frames(wire)


def test_prefix_too_long_is_rejected() -> None:
    body = b"\x01\x41" + b"1" * 65
    with pytest.raises(RemoteProtocolError, match="too long"):
        parse_frames(encode_header(FrameType.REGISTER, FLAG_FINAL, 0, len(body)) + body)


def test_garbage_after_valid_frame_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError):
        parse_frames(encode_frame(EndFrame(1)) + b"\x00")


@pytest.mark.parametrize(
    "frame",
    [
        OpenFrame(2, "bad name!", 80),
        OpenFrame(2, "ok", 0),
        OpenFrame(2, "ok", 65536),
        OpenFrame(0, "ok", 80),
        CreditFrame(1, 0),
        CreditFrame(1, 1 << 32),
        DataFrame(1 << 32, b""),
        DatagramFrame(b""),
        PingFrame(b"short"),
        DataFrame(1, bytes(MAX_FRAME_PAYLOAD_BYTES + 1)),
        RegisterFrame(("bad_name",), (), True),
        RegisterFrame((), ("not a prefix",), True),
    ],
)
def test_encoder_refuses_what_we_should_never_send(frame: Frame) -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(frame)


def test_reason_is_bounded_and_cleaned() -> None:
    long = "é" * 300  # two bytes each: cut on a character boundary
    wire = encode_frame(ResetFrame(1, StreamCode.INTERNAL, long))
    (frame,) = parse_frames(wire)
    assert isinstance(frame, ResetFrame)
    assert len(frame.reason.encode()) <= MAX_REASON_BYTES
    assert frame.reason == "é" * (MAX_REASON_BYTES // 2)
    assert clean_reason("line\nbreak\x00") == "line?break?"


def test_reason_with_bad_utf8_is_replaced_not_fatal() -> None:
    body = bytes([CloseCode.NORMAL]) + b"bye \xff\xfe\n"
    (frame,) = parse_frames(encode_header(FrameType.CLOSE, 0, 0, len(body)) + body)
    assert isinstance(frame, CloseFrame)
    assert frame.reason == "bye \ufffd\ufffd?"


def test_register_ten_thousand_nodes_is_chunked() -> None:
    nodes = [f"edge-gpu-{i}.site-{i % 97}.example.internal" for i in range(10_000)]
    prefixes = [f"10.{i // 256}.{i % 256}.0/24" for i in range(2_000)]
    frames = encode_register(nodes, prefixes, max_payload=MAX_FRAME_PAYLOAD_BYTES)
    assert len(frames) > 3
    for wire in frames:
        assert len(wire) <= MAX_FRAME_PAYLOAD_BYTES + FRAME_HEADER_BYTES
    parsed = [f for wire in frames for f in parse_frames(wire)]
    assert all(isinstance(f, RegisterFrame) for f in parsed)
    assert [f.final for f in parsed if isinstance(f, RegisterFrame)] == [False] * (
        len(parsed) - 1
    ) + [True]
    assert [n for f in parsed if isinstance(f, RegisterFrame) for n in f.nodes] == nodes
    assert [p for f in parsed if isinstance(f, RegisterFrame) for p in f.prefixes] == prefixes


def test_empty_registration_is_one_final_frame() -> None:
    (wire,) = encode_register([], [])
    assert parse_frames(wire) == [RegisterFrame((), (), True)]


def test_register_result_chunked_with_refusals() -> None:
    accepted = [f"n{i}" for i in range(3000)]
    refused = [(f"x{i}", "not authorised for this key " * 3) for i in range(3000)]
    frames = encode_register_result(accepted, ["10.0.0.0/8"], refused, max_payload=4096)
    parsed = [f for wire in frames for f in parse_frames(wire)]
    results = [f for f in parsed if isinstance(f, RegisterResultFrame)]
    assert len(results) == len(parsed) > 10
    assert results[-1].final and not any(f.final for f in results[:-1])
    assert [n for f in results for n in f.accepted_nodes] == accepted
    assert [r for f in results for r in f.refused] == refused


# --------------------------------------------------------------------------- fuzz


@given(st.binary(max_size=600))
def test_fuzz_any_bytes_parse_or_remote_error(data: bytes) -> None:
    try:
        frames = parse_frames(data)
    except RemoteProtocolError:
        return
    # whatever parsed re-encodes (names are normalised, so compare parsed forms)
    again = parse_frames(b"".join(encode_frame(f) for f in frames))
    assert again == frames


@given(
    st.integers(0, 14),
    st.integers(0, 3),
    st.integers(0, 5),
    st.binary(max_size=300),
)
def test_fuzz_valid_headers_random_bodies(
    ftype: int, flags: int, stream_id: int, body: bytes
) -> None:
    wire = struct.pack(">BBIH", ftype, flags, stream_id, len(body)) + body
    with contextlib.suppress(RemoteProtocolError):
        parse_frames(wire)


@given(st.integers(0, len(SAMPLES) - 1), st.data())
def test_fuzz_mutated_valid_frames(index: int, data: st.DataObject) -> None:
    wire = bytearray(b"".join(encode_frame(f) for f in SAMPLES[index:]))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(wire) - 1))
        wire[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    with contextlib.suppress(RemoteProtocolError):
        parse_frames(bytes(wire[:cut]))
