"""The tunnel's and the channel's lifecycles, each one table (like the stream table).

Inputs named ``SEND_*`` or ``LOCAL_*`` are our own calls: an illegal one raises
:class:`LocalProtocolError` (a bug of ours, or a call that lost a race the adapter must
handle). Inputs named ``RECV_*`` come from the peer: an illegal one raises
:class:`RemoteProtocolError`. Cells missing from a table are illegal; a test walks
every cell of both tables.

The channel (:class:`~raven.protocol.secure_channel.SecureChannel`) carries the
handshake and the records. A responder holds transport keys after message 1 but
counts the session as *established* only once the initiator's first authenticated
record arrives (key confirmation, as WireGuard): a replayed message 1 never gets
that far, so it can never replace a live session.

The tunnel (:class:`~raven.protocol.mux.Multiplexer`) starts once the channel is
established, then drains (GOAWAY either way) and closes.
"""

from __future__ import annotations

import enum

from raven.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError


class TableEnum(enum.Enum):
    """States and inputs of the lifecycle tables, looked up several times per request.

    Members are singletons compared by identity, so the identity hash (a C slot) serves;
    ``Enum.__hash__`` is a Python function hashing the member's name (~23 calls a request
    in the gateway, measured)."""

    __hash__ = object.__hash__


class ChannelState(TableEnum):
    AWAIT_MAGIC = "await_magic"  # responder: nothing read yet
    AWAIT_INITIATION = "await_initiation"  # responder: magic read
    AWAIT_RESPONSE = "await_response"  # initiator: message 1 queued
    AWAIT_CONFIRMATION = "await_confirmation"  # responder: keys derived, no record yet
    ESTABLISHED = "established"  # transport keys confirmed by a record
    REKEYING = "rekeying"  # initiator: a re-handshake's message 1 sent, records flow on
    AWAIT_SWITCH = "await_switch"  # responder: re-handshake answered, sending on new keys
    FAILED = "failed"  # the peer broke the protocol; nothing more is read


class ChannelInput(TableEnum):
    RECV_MAGIC = "recv_magic"
    RECV_INITIATION = "recv_initiation"  # a valid, fresh, authorised message 1
    RECV_RESPONSE = "recv_response"  # a valid message 2
    SEND_COOKIE_REPLY = "send_cookie_reply"  # responder, under load: prove your address first
    RECV_COOKIE_REPLY = "recv_cookie_reply"  # initiator: a valid cookie reply, initiate again
    RECV_RECORD = "recv_record"  # an authenticated record
    RECV_INVALID = "recv_invalid"  # anything that breaks the protocol
    SEND_RECORD = "send_record"
    SEND_REHANDSHAKE = "send_rehandshake"  # initiator: new DH keys, inside the session
    RECV_REHANDSHAKE = "recv_rehandshake"  # responder: a valid re-handshake message 1
    RECV_REHANDSHAKE_RESPONSE = "recv_rehandshake_response"  # initiator: its message 2
    RECV_SWITCH = "recv_switch"  # responder: the initiator sends on the new keys now


class TunnelState(TableEnum):
    HANDSHAKING = "handshaking"  # the channel is not established yet
    OPEN = "open"  # streams either way
    DRAINING_LOCAL = "draining_local"  # we sent GOAWAY: no new streams either way
    DRAINING_REMOTE = "draining_remote"  # the peer sent GOAWAY
    DRAINING_BOTH = "draining_both"  # both sent GOAWAY
    CLOSED = "closed"  # ConnectionTerminated was emitted


class TunnelInput(TableEnum):
    LOCAL_CONFIRMED = "local_confirmed"  # the channel reports its keys confirmed
    SEND_OPEN_STREAM = "send_open_stream"
    SEND_REGISTRATION = "send_registration"  # REGISTER or REGISTER_RESULT
    SEND_GOAWAY = "send_goaway"
    RECV_FRAMES = "recv_frames"  # a record's frames payload
    RECV_GOAWAY = "recv_goaway"
    RECV_CLOSE = "recv_close"
    LOCAL_CLOSE = "local_close"  # our close, a timeout, or the peer's protocol violation


_C = ChannelState
_CI = ChannelInput
_T = TunnelState
_TI = TunnelInput

#: (state, input) -> next state for the channel. Anything missing is illegal.
CHANNEL_TRANSITIONS: dict[tuple[ChannelState, ChannelInput], ChannelState] = {
    (_C.AWAIT_MAGIC, _CI.RECV_MAGIC): _C.AWAIT_INITIATION,
    (_C.AWAIT_INITIATION, _CI.RECV_INITIATION): _C.AWAIT_CONFIRMATION,
    (_C.AWAIT_RESPONSE, _CI.RECV_RESPONSE): _C.ESTABLISHED,
    (_C.AWAIT_INITIATION, _CI.SEND_COOKIE_REPLY): _C.AWAIT_INITIATION,
    (_C.AWAIT_RESPONSE, _CI.RECV_COOKIE_REPLY): _C.AWAIT_RESPONSE,
    (_C.AWAIT_CONFIRMATION, _CI.RECV_RECORD): _C.ESTABLISHED,
    (_C.ESTABLISHED, _CI.RECV_RECORD): _C.ESTABLISHED,
    (_C.ESTABLISHED, _CI.SEND_RECORD): _C.ESTABLISHED,
    (_C.AWAIT_MAGIC, _CI.RECV_INVALID): _C.FAILED,
    (_C.AWAIT_INITIATION, _CI.RECV_INVALID): _C.FAILED,
    (_C.AWAIT_RESPONSE, _CI.RECV_INVALID): _C.FAILED,
    (_C.AWAIT_CONFIRMATION, _CI.RECV_INVALID): _C.FAILED,
    (_C.ESTABLISHED, _CI.RECV_INVALID): _C.FAILED,
    # after a bad record the keys still work: a final CLOSE may go out
    (_C.FAILED, _CI.SEND_RECORD): _C.FAILED,
    # re-handshake (new Diffie-Hellman) inside the session; records flow throughout
    (_C.ESTABLISHED, _CI.SEND_REHANDSHAKE): _C.REKEYING,
    (_C.REKEYING, _CI.RECV_REHANDSHAKE_RESPONSE): _C.ESTABLISHED,
    (_C.ESTABLISHED, _CI.RECV_REHANDSHAKE): _C.AWAIT_SWITCH,
    (_C.AWAIT_SWITCH, _CI.RECV_SWITCH): _C.ESTABLISHED,
}
for _rekey_state in (_C.REKEYING, _C.AWAIT_SWITCH):
    CHANNEL_TRANSITIONS[(_rekey_state, _CI.RECV_RECORD)] = _rekey_state
    CHANNEL_TRANSITIONS[(_rekey_state, _CI.SEND_RECORD)] = _rekey_state
    CHANNEL_TRANSITIONS[(_rekey_state, _CI.RECV_INVALID)] = _C.FAILED

#: Channel states in which the keys are confirmed and records flow both ways.
ESTABLISHED_STATES = frozenset({_C.ESTABLISHED, _C.REKEYING, _C.AWAIT_SWITCH})

_DRAINING = (_T.DRAINING_LOCAL, _T.DRAINING_REMOTE, _T.DRAINING_BOTH)
_LIVE = (_T.OPEN, *_DRAINING)

#: (state, input) -> next state for the tunnel. Anything missing is illegal.
TUNNEL_TRANSITIONS: dict[tuple[TunnelState, TunnelInput], TunnelState] = {
    (_T.HANDSHAKING, _TI.LOCAL_CONFIRMED): _T.OPEN,
    # streams and a registration may be asked for early: they go out after confirmation
    (_T.HANDSHAKING, _TI.SEND_OPEN_STREAM): _T.HANDSHAKING,
    (_T.HANDSHAKING, _TI.SEND_REGISTRATION): _T.HANDSHAKING,
    (_T.HANDSHAKING, _TI.LOCAL_CLOSE): _T.CLOSED,
    (_T.OPEN, _TI.SEND_OPEN_STREAM): _T.OPEN,
    (_T.OPEN, _TI.SEND_GOAWAY): _T.DRAINING_LOCAL,
    (_T.OPEN, _TI.RECV_GOAWAY): _T.DRAINING_REMOTE,
    (_T.DRAINING_LOCAL, _TI.SEND_GOAWAY): _T.DRAINING_LOCAL,  # a repeat sends nothing
    (_T.DRAINING_LOCAL, _TI.RECV_GOAWAY): _T.DRAINING_BOTH,
    (_T.DRAINING_REMOTE, _TI.SEND_GOAWAY): _T.DRAINING_BOTH,
    (_T.DRAINING_REMOTE, _TI.RECV_GOAWAY): _T.DRAINING_REMOTE,  # a repeat is ignored
    (_T.DRAINING_BOTH, _TI.SEND_GOAWAY): _T.DRAINING_BOTH,
    (_T.DRAINING_BOTH, _TI.RECV_GOAWAY): _T.DRAINING_BOTH,
}
for _state in _LIVE:
    TUNNEL_TRANSITIONS[(_state, _TI.SEND_REGISTRATION)] = _state
    TUNNEL_TRANSITIONS[(_state, _TI.RECV_FRAMES)] = _state
    TUNNEL_TRANSITIONS[(_state, _TI.RECV_CLOSE)] = _T.CLOSED
    TUNNEL_TRANSITIONS[(_state, _TI.LOCAL_CLOSE)] = _T.CLOSED

#: Tunnel states in which no new stream may be opened either way.
DRAINING_STATES = frozenset(_DRAINING)


def illegal_move(what: str, state: enum.Enum, event: enum.Enum) -> ProtocolError:
    """The error of a move missing from a state table (stream, channel or tunnel): a
    RemoteProtocolError for the peer's input (``RECV_*``), a LocalProtocolError for ours.
    Each table's lookup is written out where its moves are made (``Stream.apply``,
    ``next_channel_state``, ``next_tunnel_state``: one call a move, on the hot path)."""
    message = f"{event.value} is not allowed on a {what} in state {state.value}"
    if event.name.startswith("RECV_"):
        return RemoteProtocolError(message)
    return LocalProtocolError(message)


def next_channel_state(state: ChannelState, event: ChannelInput) -> ChannelState:
    """The channel table lookup; raises Local/RemoteProtocolError on an illegal move."""
    try:
        return CHANNEL_TRANSITIONS[(state, event)]
    except KeyError:
        raise illegal_move("channel", state, event) from None


def next_tunnel_state(state: TunnelState, event: TunnelInput) -> TunnelState:
    """The tunnel table lookup; raises Local/RemoteProtocolError on an illegal move."""
    try:
        return TUNNEL_TRANSITIONS[(state, event)]
    except KeyError:
        raise illegal_move("tunnel", state, event) from None
