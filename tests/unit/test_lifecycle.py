"""The tunnel and channel lifecycle tables: every cell walked, and the objects follow them."""

from __future__ import annotations

import itertools

import pytest

from raven.protocol.codes import CloseCode
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.lifecycle import (
    CHANNEL_TRANSITIONS,
    TUNNEL_TRANSITIONS,
    ChannelInput,
    ChannelState,
    TunnelInput,
    TunnelState,
    next_channel_state,
    next_tunnel_state,
)
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer


@pytest.mark.parametrize(("state", "event"), list(itertools.product(TunnelState, TunnelInput)))
def test_every_cell_of_the_tunnel_table(state: TunnelState, event: TunnelInput) -> None:
    if (state, event) in TUNNEL_TRANSITIONS:
        assert next_tunnel_state(state, event) is TUNNEL_TRANSITIONS[(state, event)]
        return
    expected = RemoteProtocolError if event.name.startswith("RECV_") else LocalProtocolError
    with pytest.raises(expected, match=event.value):
        next_tunnel_state(state, event)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(ChannelState, ChannelInput)))
def test_every_cell_of_the_channel_table(state: ChannelState, event: ChannelInput) -> None:
    if (state, event) in CHANNEL_TRANSITIONS:
        assert next_channel_state(state, event) is CHANNEL_TRANSITIONS[(state, event)]
        return
    expected = RemoteProtocolError if event.name.startswith("RECV_") else LocalProtocolError
    with pytest.raises(expected, match=event.value):
        next_channel_state(state, event)


def _reachable(table: dict[tuple[object, object], object], start: object) -> set[object]:
    seen = {start}
    while True:
        more = {dst for (src, _), dst in table.items() if src in seen} - seen
        if not more:
            return seen
        seen |= more


def test_every_state_is_reachable_and_terminal_states_stay() -> None:
    assert _reachable(TUNNEL_TRANSITIONS, TunnelState.HANDSHAKING) == set(TunnelState)  # type: ignore[arg-type]
    starts = {ChannelState.AWAIT_MAGIC, ChannelState.AWAIT_RESPONSE}
    channel = set().union(*(_reachable(CHANNEL_TRANSITIONS, s) for s in starts))  # type: ignore[arg-type]
    assert channel == set(ChannelState)
    assert not [k for k in TUNNEL_TRANSITIONS if k[0] is TunnelState.CLOSED]
    assert {v for k, v in CHANNEL_TRANSITIONS.items() if k[0] is ChannelState.FAILED} == {
        ChannelState.FAILED
    }
    # nothing but key confirmation leaves the unconfirmed responder state, but failure
    assert {e for (s, e) in CHANNEL_TRANSITIONS if s is ChannelState.AWAIT_CONFIRMATION} == {
        ChannelInput.RECV_RECORD,
        ChannelInput.RECV_INVALID,
    }


def test_multiplexer_follows_the_tunnel_table() -> None:
    mux = Multiplexer(initiator=False, limits=Limits(), now=0.0)
    assert mux.state is TunnelState.HANDSHAKING and mux.get_timer() is None
    with pytest.raises(RemoteProtocolError):
        mux.receive_payload(b"", 0.0)  # no records before the keys are confirmed
    with pytest.raises(LocalProtocolError):
        mux.go_away(CloseCode.DRAINED, "", 0.0)
    mux.confirm(0.0)
    assert mux.state is TunnelState.OPEN
    with pytest.raises(LocalProtocolError):
        mux.confirm(0.0)
    mux.go_away(CloseCode.DRAINED, "", 0.0)
    mux.go_away(CloseCode.DRAINED, "", 0.0)  # a repeat is a no-op
    assert mux.state is TunnelState.DRAINING_LOCAL and mux.draining
    with pytest.raises(LocalProtocolError, match="send_open_stream"):
        mux.open_stream("edge-gpu-1", 9400)
    mux.close(CloseCode.NORMAL, "bye")
    assert mux.state is TunnelState.CLOSED and mux.closed
    with pytest.raises(LocalProtocolError, match="send_registration"):
        mux.answer_registration([])


def test_frames_received_on_an_open_tunnel_leave_it_open() -> None:
    """Multiplexer.receive_payload skips the move for an OPEN tunnel (once per record): that
    holds only while the table makes RECV_FRAMES a self-loop on OPEN."""
    assert TUNNEL_TRANSITIONS[(TunnelState.OPEN, TunnelInput.RECV_FRAMES)] is TunnelState.OPEN
