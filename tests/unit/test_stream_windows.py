"""Receive windows that follow the number of live streams (StreamTable.retarget).

New streams get windows first-come (1 MiB each until the tunnel's budget runs short, then the
16 KiB floor); each credit then moves a stream's window toward the fair share of the budget,
so a tunnel with hundreds of busy streams does not run most of them on the floor (a CREDIT
every 4 KiB). The flow-control invariants hold throughout: per stream, unread bytes plus the
credit the peer holds equal the window; the windows sum to ``reserved``, within the budget.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.limits import Limits
from raven.protocol.stream_table import MIN_STREAM_WINDOW_BYTES, StreamTable
from raven.protocol.streams import Stream

LIMITS = Limits()
RATIO = LIMITS.credit_update_ratio


def open_streams(table: StreamTable, count: int) -> list[Stream]:
    streams = []
    for _ in range(count):
        window, why = table.window_for_new_stream()
        assert window, why
        stream = table.add(table.take_local_id(), window)
        stream.grant_window()
        streams.append(stream)
    return streams


def receive(table: StreamTable, stream: Stream, size: int) -> None:
    assert stream.on_data(size), "the peer may send only what it was granted"
    table.buffered += size


def consume(table: StreamTable, stream: Stream, size: int) -> int:
    """What Multiplexer.consume_stream_data does: the credit sent back (0: none)."""
    credit = stream.on_consumed(size, RATIO)
    table.buffered -= size
    return table.retarget(stream, credit) if credit else 0


def check(table: StreamTable) -> None:
    assert table.reserved == sum(s.window for s in table.streams.values())
    unopened = (LIMITS.max_streams - len(table)) * MIN_STREAM_WINDOW_BYTES
    assert table.reserved <= LIMITS.max_tunnel_buffered_bytes - unopened
    for s in table.streams.values():
        outstanding = s.recv_granted - s.recv_total
        assert s.buffered + outstanding + s.consumed_ungranted == s.window
        assert MIN_STREAM_WINDOW_BYTES <= s.window <= LIMITS.stream_window_bytes


def test_few_streams_keep_the_full_window() -> None:
    table = StreamTable(initiator=True, limits=LIMITS)
    (stream,) = open_streams(table, 1)
    receive(table, stream, 400_000)
    assert consume(table, stream, 400_000) == 400_000  # all of it back: 1 MiB stays 1 MiB
    assert stream.window == LIMITS.stream_window_bytes
    check(table)


def test_256_busy_streams_even_out_their_windows() -> None:
    """Opened in a row, 48 streams get 1 MiB and most of the rest the floor; after each has
    moved a few responses, every window is near the fair share (~208 KiB)."""
    table = StreamTable(initiator=True, limits=LIMITS)
    streams = open_streams(table, 256)
    assert sum(s.window == LIMITS.stream_window_bytes for s in streams) == 48
    assert sum(s.window <= 32 * 1024 for s in streams) > 200
    fair = table.fair_window()
    assert 200 * 1024 < fair < 216 * 1024
    for _ in range(12):  # responses of 100 KB each, every stream in turn
        for s in streams:
            sent = 0
            while sent < 100_000:
                size = min(100_000 - sent, s.recv_granted - s.recv_total)
                assert size > 0, "a stream ran out of credit with nothing unread"
                receive(table, s, size)
                consume(table, s, size)
                sent += size
            check(table)
    windows = sorted(s.window for s in streams)
    assert windows[0] >= fair // 2 and windows[-1] <= fair + 64 * 1024, windows[::32]


@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=300))
def test_windows_keep_the_flow_control_invariants(seed: int, opened: int) -> None:
    """Random receives, reads, opens and closes: the invariants of check() after each."""
    rng = random.Random(seed)
    table = StreamTable(initiator=True, limits=LIMITS)
    streams = open_streams(table, opened)
    for _ in range(400):
        action = rng.random()
        if action < 0.05 and streams:
            table.forget(streams.pop(rng.randrange(len(streams))))
        elif action < 0.1:
            if table.window_for_new_stream()[0]:
                streams += open_streams(table, 1)
        elif streams:
            s = rng.choice(streams)
            room = s.recv_granted - s.recv_total
            if room and rng.random() < 0.5:
                receive(table, s, rng.randint(1, room))
            elif s.buffered:
                consume(table, s, rng.randint(1, s.buffered))
        check(table)
