"""The DATAGRAM fast path on receive (raven.protocol.datagram_path): DATAGRAM-only records
split without Frame objects and handed to a sink; everything else on the generic path, with
the generic path's errors; for any payload the same packets, events, errors and counters."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import CloseCode
from raven.protocol.datagram_path import split_datagrams
from raven.protocol.errors import RemoteProtocolError
from raven.protocol.events import DatagramReceived, Event
from raven.protocol.frames import (
    HEADER,
    DatagramFrame,
    FrameType,
    GoAwayFrame,
    PingFrame,
    encode_frame,
    parse_frames,
)
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from tests.helpers.mux import LIMITS
from tests.helpers.sansio import connected, events, pump


def datagram(data: bytes) -> bytes:
    return encode_frame(DatagramFrame(data))


def header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(ftype, flags, stream_id, length)


def mux_with_sink(limits: Limits = LIMITS) -> tuple[Multiplexer, list[bytes]]:
    mux = Multiplexer(initiator=True, limits=limits, now=0.0)
    mux.confirm(0.0)
    got: list[bytes] = []
    mux.datagrams.sink = got.append
    return mux, got


def drain(mux: Multiplexer) -> list[Event]:
    out: list[Event] = []
    while (event := mux.events.popleft()) is not None:
        out.append(event)
    return out


def test_datagram_only_payload_is_split_and_sunk() -> None:
    packets = [b"\x45" + bytes(59), b"\x60" + bytes(99), b"\x45one"]
    payload = b"".join(datagram(p) for p in packets)
    assert split_datagrams(payload) == packets
    mux, got = mux_with_sink()
    mux.receive_payload(payload, 1.0)
    assert got == packets
    assert drain(mux) == []  # no event objects on the fast path
    assert mux.stats.frames_received == {"datagram": 3}
    assert mux.stats.datagrams_received == 3


def test_without_a_sink_packets_are_events_as_before() -> None:
    packets = [b"\x45a", b"\x45b"]
    mux = Multiplexer(initiator=True, limits=LIMITS, now=0.0)
    mux.confirm(0.0)
    mux.receive_payload(b"".join(datagram(p) for p in packets), 0.0)
    assert drain(mux) == [DatagramReceived(p) for p in packets]


def test_mixed_payload_takes_the_generic_path_and_still_sinks_packets() -> None:
    payload = datagram(b"\x45a") + encode_frame(PingFrame(bytes(8))) + datagram(b"\x45b")
    assert split_datagrams(payload) is None
    mux, got = mux_with_sink()
    mux.receive_payload(payload, 0.0)
    assert got == [b"\x45a", b"\x45b"]
    assert mux.stats.frames_received == {"datagram": 2, "ping": 1}
    assert mux.stats.datagrams_received == 2
    pong = mux.next_payload()
    assert pong is not None and pong[0] == FrameType.PONG
    goaway = encode_frame(GoAwayFrame(CloseCode.DRAINED, "bye"))
    assert split_datagrams(goaway + datagram(b"\x45c")) is None  # first frame not a DATAGRAM


MALFORMED = {
    "empty": (datagram(b"\x45a") + header(6, 0, 0, 0), "empty DATAGRAM frame"),
    "flags": (header(6, 1, 0, 1) + b"x", "unknown flags 0x1 on datagram frame"),
    "stream id": (datagram(b"\x45a") + header(6, 0, 5, 1) + b"x", "bad stream id 5 on datagram"),
    "truncated header": (datagram(b"\x45a") + header(6, 0, 0, 1)[:5], "truncated frame header"),
    "past the end": (header(6, 0, 0, 9) + b"short", "frame runs past the end of its record"),
    "unknown type": (datagram(b"\x45a") + header(99, 0, 0, 1) + b"x", "unknown frame type 99"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_datagram_frames_raise_the_generic_errors(name: str) -> None:
    payload, message = MALFORMED[name]
    assert split_datagrams(payload) is None
    with pytest.raises(RemoteProtocolError) as generic:
        parse_frames(payload)
    mux, got = mux_with_sink()
    with pytest.raises(RemoteProtocolError) as fast:
        mux.receive_payload(payload, 0.0)
    assert message in str(fast.value)
    assert str(fast.value) == str(generic.value) and fast.value.code == generic.value.code
    assert got == []  # nothing of a bad record is acted on, not even its good frames


def test_oversize_received_datagrams_are_dropped_and_counted() -> None:
    mux, got = mux_with_sink(replace(LIMITS, max_datagram_bytes=10))
    mux.receive_payload(datagram(b"\x45" + bytes(9)) + datagram(bytes(11)), 0.0)
    assert got == [b"\x45" + bytes(9)]
    assert mux.stats.datagrams_received == 1
    assert mux.stats.datagrams_dropped == {"oversize_received": 1}


def test_connection_sink_replaces_the_events_and_can_be_removed() -> None:
    agent, gateway = connected()
    got: list[bytes] = []
    gateway.set_datagram_sink(got.append)
    for i in range(3):
        assert agent.send_datagram(b"\x45" + bytes([i]) * 40)
    pump(agent, gateway)
    assert got == [b"\x45" + bytes([i]) * 40 for i in range(3)]
    assert events(gateway) == []
    gateway.set_datagram_sink(None)
    agent.send_datagram(b"\x45late")
    pump(agent, gateway)
    assert events(gateway) == [DatagramReceived(b"\x45late")]


# --------------------------------------------------------------------------- fuzz

_chunks = st.one_of(
    st.binary(min_size=1, max_size=30).map(datagram),
    st.binary(max_size=12),
    st.tuples(
        st.sampled_from([6, 6, 6, 0, 7, 12, 99]),
        st.sampled_from([0, 0, 0, 1]),
        st.sampled_from([0, 0, 0, 3]),
        st.integers(0, 40),
        st.binary(max_size=40),
    ).map(lambda t: header(*t[:4]) + t[4]),
    st.sampled_from(
        [encode_frame(PingFrame(bytes(8))), encode_frame(GoAwayFrame(CloseCode.NORMAL, ""))]
    ),
)
_payloads = st.lists(_chunks, max_size=6).map(b"".join)


@given(_payloads)
def test_fuzz_fast_split_agrees_with_the_generic_parser(payload: bytes) -> None:
    fast = split_datagrams(payload)
    try:
        frames = parse_frames(payload)
    except RemoteProtocolError:
        assert fast is None
        return
    if frames and all(type(f) is DatagramFrame for f in frames):
        assert fast == [f.data for f in frames if isinstance(f, DatagramFrame)]
    else:
        assert fast is None


def _outcome(payloads: list[bytes], sink: bool) -> tuple[object, ...]:
    mux = Multiplexer(initiator=True, limits=replace(LIMITS, max_datagram_bytes=20), now=0.0)
    mux.confirm(0.0)
    got: list[bytes] = []
    if sink:
        mux.datagrams.sink = got.append
    error = None
    seen: list[Event] = []
    for payload in payloads:
        try:
            mux.receive_payload(payload, 0.0)
        except RemoteProtocolError as exc:
            error = (exc.code, str(exc))  # what was acted on before it still counts
        seen += drain(mux)
        if error:
            break
    packets = got + [e.data for e in seen if isinstance(e, DatagramReceived)]
    others = [e for e in seen if not isinstance(e, DatagramReceived)]
    stats = mux.stats
    counters = (stats.frames_received, stats.datagrams_received, stats.datagrams_dropped)
    return packets, others, error, counters, mux.state


@given(st.lists(_payloads, max_size=4))
def test_fuzz_sink_and_events_see_the_same_packets_errors_and_counters(
    payloads: list[bytes],
) -> None:
    assert _outcome(payloads, sink=True) == _outcome(payloads, sink=False)


_PING = encode_frame(PingFrame(bytes(8)))


def _through_mux(payload: bytes) -> tuple[object, ...]:
    mux, got = mux_with_sink(replace(LIMITS, max_datagram_bytes=20))
    try:
        mux.receive_payload(payload, 0.0)
    except RemoteProtocolError as exc:
        return got, (exc.code, str(exc)), {}, 0, {}
    frames = dict(mux.stats.frames_received)
    frames.pop("ping", None)
    stats = mux.stats
    return got, None, frames, stats.datagrams_received, stats.datagrams_dropped


@given(_payloads)
def test_fuzz_fast_path_matches_the_generic_path(payload: bytes) -> None:
    """A PING in front sends the same frames down the generic path: same packets, same
    errors, same counters (less the PING) as the fast path gives."""
    assert split_datagrams(_PING + payload) is None
    assert _through_mux(payload) == _through_mux(_PING + payload)
