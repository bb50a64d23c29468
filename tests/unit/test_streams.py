"""The stream state table, walked whole, and per-stream credit accounting."""

from __future__ import annotations

from collections import deque

import pytest

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.streams import (
    MAX_SEND_CREDIT,
    RECEIVING_STATES,
    SENDING_STATES,
    TRANSITIONS,
    Stream,
    StreamInput,
    StreamState,
)

S = StreamState
I = StreamInput  # noqa: E741


@pytest.mark.parametrize("state", list(StreamState))
@pytest.mark.parametrize("event", list(StreamInput))
def test_every_cell_of_the_table(state: StreamState, event: StreamInput) -> None:
    """Each (state, input) either follows the table or raises, named by whose fault it is."""
    stream = Stream(1, 1024)
    stream.state = state
    if (state, event) in TRANSITIONS:
        assert stream.apply(event) is TRANSITIONS[(state, event)] is stream.state
        return
    expected = LocalProtocolError if event.local else RemoteProtocolError
    with pytest.raises(expected, match=event.value):
        stream.apply(event)
    assert stream.state is state  # an illegal move leaves the stream where it was


def test_every_state_is_reachable_and_closed_only_loops() -> None:
    seen = {S.IDLE}
    todo = deque([S.IDLE])
    while todo:
        state = todo.popleft()
        for (src, _event), dst in TRANSITIONS.items():
            if src is state and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    assert seen == set(StreamState)
    assert {TRANSITIONS[key] for key in TRANSITIONS if key[0] is S.CLOSED} == {S.CLOSED}
    assert {e for (state, e) in TRANSITIONS if state is S.CLOSED} == {
        I.RECV_CREDIT,
        I.RECV_RESET,
        I.SEND_RESET,
    }


def test_lifecycles() -> None:
    walks = [
        # we open, peer accepts, both half-close
        [I.SEND_OPEN, I.SEND_CREDIT, I.RECV_ACCEPT, I.RECV_CREDIT, I.SEND_DATA, I.SEND_END,
         I.RECV_DATA, I.RECV_END],
        # peer opens, we accept, the peer ends first
        [I.RECV_OPEN, I.RECV_CREDIT, I.SEND_ACCEPT, I.SEND_CREDIT, I.RECV_DATA, I.RECV_END,
         I.SEND_DATA, I.SEND_END],
        [I.SEND_OPEN, I.RECV_REFUSE],
        [I.RECV_OPEN, I.SEND_REFUSE],
        [I.SEND_OPEN, I.SEND_RESET],
        [I.RECV_OPEN, I.SEND_ACCEPT, I.RECV_RESET],
    ]  # fmt: skip
    for walk in walks:
        stream = Stream(1, 100)
        for event in walk:
            stream.apply(event)
        assert stream.state is S.CLOSED, walk


def test_sending_and_receiving_states() -> None:
    assert {s for s in S if (s, I.SEND_DATA) in TRANSITIONS} == SENDING_STATES
    assert {s for s in S if (s, I.RECV_DATA) in TRANSITIONS} == RECEIVING_STATES


def test_no_data_after_end_either_way() -> None:
    stream = Stream(1, 100)
    for event in (I.RECV_OPEN, I.SEND_ACCEPT, I.SEND_END):
        stream.apply(event)
    with pytest.raises(LocalProtocolError):
        stream.apply(I.SEND_DATA)
    stream.apply(I.RECV_DATA)
    stream.apply(I.RECV_END)
    with pytest.raises(RemoteProtocolError):
        stream.apply(I.RECV_DATA)


def test_receive_window_and_credit_return() -> None:
    stream = Stream(1, 1000)
    assert stream.grant_window() == 1000
    assert stream.on_data(600)
    assert stream.on_data(400)
    assert stream.buffered == 1000
    assert stream.on_consumed(200, 0.25) == 0  # below a quarter of the window
    assert stream.on_consumed(100, 0.25) == 300  # 300 >= 250: grant all of it
    assert stream.buffered == 700
    assert stream.on_data(300)  # exactly the returned credit
    assert not stream.on_data(1)  # one byte beyond what was granted
    with pytest.raises(LocalProtocolError):
        stream.on_consumed(10_000, 0.25)


def test_send_credit_and_queue() -> None:
    stream = Stream(1, 1000)
    stream.on_credit(10)
    with pytest.raises(LocalProtocolError, match="credit"):
        stream.enqueue(b"x" * 11)
    buf = bytearray(b"abcdef")
    stream.enqueue(buf)
    buf[:] = b"XXXXXX"  # the caller reuses its buffer: our copy is unaffected
    stream.enqueue(b"ghij")
    assert stream.send_credit == 0
    assert stream.queued_bytes == 10
    assert b"".join(stream.take(4)) == b"abcd"
    assert b"".join(stream.take(100)) == b"efghij"
    assert stream.queued_bytes == 0 and stream.take(5) == []


def test_credit_overflow_is_the_peers_fault() -> None:
    stream = Stream(1, 10)
    stream.on_credit(MAX_SEND_CREDIT)
    with pytest.raises(RemoteProtocolError, match="overflow"):
        stream.on_credit(1)


def test_finished_waits_for_pending_end() -> None:
    stream = Stream(2, 10)
    for event in (I.RECV_OPEN, I.SEND_ACCEPT, I.RECV_END, I.SEND_END):
        stream.apply(event)
    stream.end_pending = True
    assert stream.state is S.CLOSED and not stream.finished  # END not on the wire yet
    stream.end_sent = True
    assert stream.finished
