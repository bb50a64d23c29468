"""WebSocket framing of the tunnel (raven.protocol.websocket): round trips in any split,
masking, control frames, and every framing rule a peer can break (fuzzed)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol import websocket as ws


def test_mask_is_its_own_inverse_and_matches_the_python_fallback() -> None:
    from raven.transport.websocket_transport import compiled_mask

    fast = compiled_mask()
    assert fast is not None, "aiohttp's compiled mask loads from its file"
    data, key = os.urandom(70_001), os.urandom(4)
    masked = bytearray(data)
    fast(key, masked)
    assert masked == ws.mask_bytes(key, data)
    slow = bytearray(data)
    ws._python_mask(key, slow)
    assert masked == slow
    assert bytes(ws.mask_bytes(key, masked)) == data


@given(
    st.lists(st.binary(min_size=0, max_size=70_000), min_size=1, max_size=4),
    st.booleans(),
    st.integers(min_value=1, max_value=5000),
)
def test_frames_split_anywhere_give_the_same_bytes(
    payloads: list[bytes], client: bool, step: int
) -> None:
    wire = b"".join(ws.encode_frame(p, mask_key=os.urandom(4) if client else None)
                    for p in payloads)  # fmt: skip
    reader = ws.FrameReader(masked=client)
    got: list[bytes] = []
    for i in range(0, len(wire), step):
        chunks, controls = reader.feed(wire[i : i + step])
        got += chunks
        assert not controls
    assert b"".join(got) == b"".join(payloads)


def test_ping_close_and_continuation() -> None:
    reader = ws.FrameReader(masked=False)
    ping = ws.encode_frame(b"hi", opcode=ws.PING, mask_key=None)
    # a fragmented binary message: first frame not final, then a continuation
    first = bytes([0x02, 3]) + b"abc"
    cont = bytes([0x80, 2]) + b"de"
    chunks, controls = reader.feed(first + ping + cont)
    assert chunks == [b"abc", b"de"]
    assert controls == [ws.Control(ws.PING, b"hi")]
    close = ws.encode_frame(ws.close_payload(1001), opcode=ws.CLOSE, mask_key=None)
    chunks, controls = reader.feed(close + ws.encode_frame(b"late", mask_key=None))
    assert chunks == [] and controls[0].opcode == ws.CLOSE and reader.closed
    assert reader.feed(b"more") == ([], [])


@pytest.mark.parametrize(
    ("wire", "masked", "error"),
    [
        (bytes([0x81, 1]) + b"x", False, "text frame"),
        (bytes([0xC2, 1]) + b"x", False, "reserved"),
        (bytes([0x82, 1]) + b"x", True, "unmasked"),
        (bytes([0x82, 0x81]) + b"kkkkx", False, "masked frame from a server"),
        (bytes([0x09, 1]) + b"x", False, "control frame"),
        (bytes([0x89, 126, 0, 200]) + bytes(200), False, "control frame"),
        (bytes([0x83, 0]), False, "opcode"),
        (bytes([0x8B, 0]), False, "opcode 11"),
        (bytes([0x82, 127]) + (1 << 40).to_bytes(8, "big"), False, "frame of"),
    ],
)
def test_framing_violations(wire: bytes, masked: bool, error: str) -> None:
    with pytest.raises(ws.WebSocketError, match=error):
        ws.FrameReader(masked=masked).feed(wire)


@given(st.binary(max_size=400), st.booleans())
def test_any_bytes_decode_or_raise_websocket_error(data: bytes, masked: bool) -> None:
    reader = ws.FrameReader(masked=masked)
    try:
        chunks, _ = reader.feed(data)
    except ws.WebSocketError:
        return
    assert sum(len(c) for c in chunks) <= len(data)
