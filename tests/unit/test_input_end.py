"""Where a large read may be cut into pieces without cutting a record in two
(message_lengths.message_end, TunnelConnection.input_end, TurnBudget's boundary): the gateway's
channel then never copies a record together from two slices of one read."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.connection import Role, TunnelConnection
from raven.protocol.events import StreamDataReceived
from raven.protocol.limits import Limits
from raven.protocol.message_lengths import MAX_WALK_MESSAGES, message_end
from raven.protocol.secure_channel import SecureChannel
from raven.transport.turn_budget import SLICE_BYTES, TurnBudget
from tests.helpers.sansio import AGENT_PUB, GW_PRIV, events, make_agent, open_stream, pump


def framed(*sizes: int) -> bytes:
    """u16-length-prefixed messages of these body sizes."""
    return b"".join(n.to_bytes(2, "big") + bytes(n) for n in sizes)


def test_the_first_message_ending_at_or_past_the_mark() -> None:
    wire = framed(100, 100, 100)  # messages end at 102, 204, 306
    assert message_end(wire, 1) == 102
    assert message_end(wire, 102) == 102
    assert message_end(wire, 103) == 204
    assert message_end(wire, 300) == 306


def test_a_message_running_past_the_view_ends_the_piece_at_the_view() -> None:
    wire = framed(100, 1000)[:500]
    assert message_end(wire, 150) == 500
    assert message_end(wire[:103], 150) == 103  # only one byte of the next length prefix


def test_the_rest_of_a_held_message_comes_first() -> None:
    wire = bytes(40) + framed(100)  # 40 bytes complete a held partial message
    assert message_end(wire, 10, first=40) == 40
    assert message_end(wire, 41, first=40) == 142


def test_many_small_messages_settle_for_the_mark() -> None:
    wire = framed(*[10] * (MAX_WALK_MESSAGES + 10))
    assert message_end(wire, 12 * (MAX_WALK_MESSAGES + 5)) == 12 * (MAX_WALK_MESSAGES + 5)


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(1, 100_000))
def test_a_cut_is_a_message_end_the_view_end_or_the_mark(sizes: list[int], mark: int) -> None:
    wire = framed(*sizes)
    ends, pos = set(), 0
    for n in sizes:
        pos += 2 + n
        ends.add(pos)
    cut = message_end(wire, mark)
    assert cut in ends | {len(wire), mark}
    assert cut >= min(mark, len(wire))


def _bulk_wire(size: int, limits: Limits) -> tuple[bytes, TunnelConnection, SecureChannel, int]:
    """``size`` bytes of one stream, sealed by an agent: the wire bytes, and the gateway
    connection (and its channel) they are for."""
    agent = make_agent(limits)
    channel = SecureChannel(role=Role.RESPONDER, static_private=GW_PRIV, limits=limits, now=0.0,
                            authorize=lambda key: key == AGENT_PUB)  # fmt: skip
    gateway = TunnelConnection(channel)
    pump(agent, gateway)
    events(agent), events(gateway)  # the handshakes
    sid = open_stream(agent, gateway)
    agent.send_stream_data(sid, bytes(range(256)) * (size // 256))
    return agent.data_to_send(), gateway, channel, sid


def _received(gateway: TunnelConnection) -> bytes:
    return b"".join(e.data for e in events(gateway) if isinstance(e, StreamDataReceived))


def test_a_large_read_cut_by_input_end_leaves_no_record_in_two() -> None:
    limits = Limits(stream_window_bytes=1024 * 1024)
    wire, gateway, channel, _ = _bulk_wire(400 * 1024, limits)
    assert len(wire) > 6 * SLICE_BYTES
    view, offset, got = memoryview(wire), 0, b""
    while offset < len(wire):
        end = offset + gateway.input_end(view[offset:], SLICE_BYTES)
        assert end - offset >= min(SLICE_BYTES, len(wire) - offset)
        gateway.receive_data(view[offset:end], 0.0)
        assert not channel.held  # every slice ended where a record did
        got += _received(gateway)
        offset = end
    assert got == bytes(range(256)) * (400 * 1024 // 256)


def test_a_held_partial_record_is_completed_first() -> None:
    limits = Limits(stream_window_bytes=1024 * 1024)
    wire, gateway, channel, _ = _bulk_wire(300 * 1024, limits)
    gateway.receive_data(wire[:1000], 0.0)  # an earlier read ended inside the first record
    assert channel.held
    view = memoryview(wire)[1000:]
    end = gateway.input_end(view, SLICE_BYTES)
    gateway.receive_data(view[:end], 0.0)
    assert not channel.held


def test_before_the_magic_a_read_is_cut_at_the_mark() -> None:
    channel = SecureChannel(role=Role.RESPONDER, static_private=GW_PRIV, limits=Limits(),
                            now=0.0, authorize=lambda key: True)  # fmt: skip
    assert TunnelConnection(channel).input_end(bytes(200_000), SLICE_BYTES) == SLICE_BYTES


async def test_the_turn_budget_cuts_where_its_boundary_says() -> None:
    got: list[int] = []
    budget = TurnBudget(asyncio.get_running_loop(), lambda data: got.append(len(data)),
                        lambda: None, object,  # type: ignore[arg-type,return-value]
                        clock=lambda: 0.0, boundary=lambda rest, mark: mark + 10)  # fmt: skip
    budget.feed(bytes(3 * SLICE_BYTES))
    assert got == [SLICE_BYTES + 10, SLICE_BYTES + 10, SLICE_BYTES - 20]


def test_plain_64_kib_slices_would_leave_a_record_in_two() -> None:
    """What input_end avoids: a bulk record is a little under 64 KiB on the wire, so a slice of
    exactly 64 KiB ends a few bytes into the next record, whose other ~64 KiB the channel then
    copies into its held buffer from the next slice."""
    limits = Limits(stream_window_bytes=1024 * 1024)
    wire, gateway, channel, _ = _bulk_wire(300 * 1024, limits)
    gateway.receive_data(memoryview(wire)[:SLICE_BYTES], 0.0)
    assert 0 < len(channel.held) < 1024
