"""The tunnel handshake: Noise_IKpsk2_25519_{ChaChaPoly,AESGCM}_BLAKE2s (WireGuard's pattern).

The edge agent (initiator) knows the gateway's static key in advance::

    -> e, es, s, ss  {TAI64N timestamp (12 bytes) || version (1 byte)}
    <- e, ee, se, psk  {accepted suites (1 byte mask)}

The initiator picks the suite (`raven.protocol.suites`): its name and the prologue follow it.

Message 1 is followed by mac1 and mac2 (raven.protocol.cookie): the responder checks
mac1 before any Diffie-Hellman.

Initiator side: :func:`create_initiation` then :func:`consume_response`.
Responder side: :func:`consume_initiation` then :func:`create_response`.
Both end with :class:`SessionKeys`. Wire layout: docs/protocol-handshake.md.

The responder rejects, with :class:`~raven.protocol.errors.HandshakeRejected`
and a short ``reason``:

- ``bad_mac1``: mac1 is not valid for this responder's public key (checked first,
  before any Diffie-Hellman);
- ``malformed``: wrong size, a low-order ephemeral key: garbage;
- ``decrypt_failed``: the static key or payload failed authentication (typically a
  message encrypted for another gateway key, or tampered);
- ``unknown_key``: ``authorize(remote_static)`` said no;
- ``unsupported_version``: an authenticated initiation of another protocol version;
- ``replay``: the timestamp is not strictly newer than the last one accepted from
  that key (:class:`ReplayGuard`).

The replay guard records a timestamp only once the initiation fully
authenticated and the key was authorized.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass

from raven.protocol.codes import CloseCode
from raven.protocol.constants import KEY_BYTES, TAG_BYTES, TIMESTAMP_BYTES
from raven.protocol.cookie import MAC_BYTES, MACS_BYTES, append_macs, check_mac1, mac1_key
from raven.protocol.errors import HandshakeRejected, LocalProtocolError, RemoteProtocolError
from raven.protocol.noise import CipherState, HandshakeState, public_key
from raven.protocol.suites import DEFAULT_SUITE, Suite, decode_mask, encode_mask, prologue
from raven.protocol.suites import protocol_name as suite_protocol_name

__all__ = [
    "INITIATION_BYTES",
    "NOISE_INITIATION_BYTES",
    "PROTOCOL_VERSION",
    "RESPONSE_BYTES",
    "InitiatorHandshake",
    "ReplayGuard",
    "ResponderHandshake",
    "SessionKeys",
    "consume_initiation",
    "consume_response",
    "create_initiation",
    "create_response",
    "parse_tai64n",
    "tai64n",
]

#: Version byte carried after the timestamp in the initiation payload.
PROTOCOL_VERSION = 2
#: Initiation payload: TAI64N timestamp + version byte.
INITIATION_PAYLOAD_BYTES = TIMESTAMP_BYTES + 1
#: Size of the Noise message 1: e (32) + encrypted s (32 + 16) + encrypted payload (13 + 16).
NOISE_INITIATION_BYTES = (
    KEY_BYTES + (KEY_BYTES + TAG_BYTES) + (INITIATION_PAYLOAD_BYTES + TAG_BYTES)
)
#: Size of message 1 on the wire: the Noise message (109) + mac1 (16) + mac2 (16).
INITIATION_BYTES = NOISE_INITIATION_BYTES + MACS_BYTES
#: Response payload: the mask of the suites the responder accepts.
RESPONSE_PAYLOAD_BYTES = 1
#: Size of message 2: e (32) + encrypted payload (1 + 16).
RESPONSE_BYTES = KEY_BYTES + RESPONSE_PAYLOAD_BYTES + TAG_BYTES

_TAI64_BASE = (1 << 62) + 10  # TAI64 label of the Unix epoch (as WireGuard writes it)
_TAI64N = struct.Struct(">QI")


def tai64n(wall_time_ns: int) -> bytes:
    """The 12-byte TAI64N label of a Unix time in nanoseconds (big-endian, so byte
    strings compare in time order)."""
    if wall_time_ns < 0:
        raise ValueError("wall_time_ns must not be negative")
    seconds, nanoseconds = divmod(wall_time_ns, 1_000_000_000)
    return _TAI64N.pack(_TAI64_BASE + seconds, nanoseconds)


def parse_tai64n(label: bytes) -> int:
    """Unix time in nanoseconds of a TAI64N label (RemoteProtocolError if invalid)."""
    if len(label) != TIMESTAMP_BYTES:
        raise RemoteProtocolError("a TAI64N timestamp is 12 bytes")
    seconds: int
    nanoseconds: int
    seconds, nanoseconds = _TAI64N.unpack(label)
    if seconds < _TAI64_BASE or nanoseconds >= 1_000_000_000:
        raise RemoteProtocolError("invalid TAI64N timestamp")
    return (seconds - _TAI64_BASE) * 1_000_000_000 + nanoseconds


class ReplayGuard:
    """The last accepted initiation timestamp per remote static key.

    Only keys that passed ``authorize`` are recorded, so memory is bounded by
    the set of authorised agents. Share one guard across all connections of a
    listener (a per-connection guard stops nothing).

    Clock-jump recovery: ``live(key)`` says whether that key has a confirmed session
    now (default: always, the strict rule). A timestamp that is not newer is refused
    only while the key is live; otherwise the handshake goes on, and it counts only
    once the initiator confirms the keys, which a replayer cannot (see
    raven.protocol.lifecycle). :meth:`confirm` then records the confirmed timestamp
    even if it is older: an agent whose clock jumped forward and came back is locked
    out at most until its last session is gone, never until its clock catches up.
    """

    def __init__(self, live: Callable[[bytes], bool] | None = None) -> None:
        self._last: dict[bytes, bytes] = {}
        self._live = live

    def is_fresh(self, remote_static: bytes, timestamp: bytes) -> bool:
        """True when ``timestamp`` is strictly newer than the last one recorded, or
        the key has no live session (the handshake must then be confirmed)."""
        last = self._last.get(remote_static)
        if last is None or timestamp > last:
            return True
        return self._live is not None and not self._live(remote_static)

    def confirm(self, remote_static: bytes, timestamp: bytes) -> None:
        """The initiator proved the handshake of ``timestamp`` live: it is the last one."""
        self._last[remote_static] = bytes(timestamp)

    def record(self, remote_static: bytes, timestamp: bytes) -> None:
        last = self._last.get(remote_static)
        if last is None or timestamp > last:
            self._last[remote_static] = bytes(timestamp)

    def last(self, remote_static: bytes) -> bytes | None:
        return self._last.get(remote_static)

    def forget(self, remote_static: bytes) -> None:
        """Drop a key (e.g. when it is removed from the authorised agents)."""
        self._last.pop(remote_static, None)

    def __len__(self) -> int:
        return len(self._last)


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Transport keys of one side after the handshake."""

    send: CipherState
    receive: CipherState
    remote_static: bytes
    handshake_hash: bytes
    #: the suite the handshake ran
    suite: Suite = DEFAULT_SUITE
    #: (initiator) the suites the responder accepts, from message 2 (responder: None)
    peer_suites: frozenset[Suite] | None = None


@dataclass(slots=True)
class InitiatorHandshake:
    """The initiator between :func:`create_initiation` and :func:`consume_response`."""

    state: HandshakeState
    remote_static: bytes
    timestamp: bytes
    #: the mac1 sent (a cookie reply is encrypted with it as associated data)
    mac1: bytes
    suite: Suite = DEFAULT_SUITE


@dataclass(slots=True)
class ResponderHandshake:
    """An authenticated, authorised, fresh initiation, ready for :func:`create_response`."""

    state: HandshakeState
    remote_static: bytes
    timestamp: bytes
    version: int
    suite: Suite = DEFAULT_SUITE


def _check_key(name: str, key: bytes) -> None:
    if len(key) != KEY_BYTES:
        raise ValueError(f"{name} must be {KEY_BYTES} bytes, got {len(key)}")


def create_initiation(
    *,
    static_private: bytes,
    remote_static: bytes,
    wall_time_ns: int,
    psk: bytes = bytes(32),
    cookie: bytes | None = None,
    ephemeral_private: bytes | None = None,
    suite: Suite = DEFAULT_SUITE,
) -> tuple[InitiatorHandshake, bytes]:
    """Message 1 of the handshake (Noise message || mac1 || mac2) and the state to read
    the response with.

    ``wall_time_ns`` is the caller's wall clock (Unix ns) for the replay timestamp;
    ``cookie`` (from the responder's cookie reply, still fresh) makes mac2;
    ``ephemeral_private`` pins the ephemeral key (tests only); ``suite`` picks the Noise
    protocol (the caller sends its byte in clear before the message).
    """
    _check_key("static_private", static_private)
    _check_key("remote_static", remote_static)
    _check_key("psk", psk)
    state = HandshakeState.initialize(
        suite_protocol_name(suite),
        initiator=True,
        prologue=prologue(suite),
        s=static_private,
        e=ephemeral_private,
        rs=remote_static,
        psks=[psk],
    )
    timestamp = tai64n(wall_time_ns)
    noise_message = state.write_message(timestamp + bytes([PROTOCOL_VERSION]))
    message = append_macs(noise_message, mac1_key(remote_static), cookie)
    mac1 = message[NOISE_INITIATION_BYTES : NOISE_INITIATION_BYTES + MAC_BYTES]
    return InitiatorHandshake(state, bytes(remote_static), timestamp, mac1, suite), message


def consume_initiation(
    message: bytes | bytearray | memoryview,
    *,
    static_private: bytes,
    authorize: Callable[[bytes], bool],
    replay_guard: ReplayGuard,
    psk: bytes = bytes(32),
    own_mac1_key: bytes | None = None,
    ephemeral_private: bytes | None = None,
    suite: Suite = DEFAULT_SUITE,
) -> ResponderHandshake:
    """Read message 1 of ``suite`` (the byte the initiator sent in clear, already checked
    against the accepted suites). Raises HandshakeRejected (reason: malformed, bad_mac1,
    decrypt_failed, unknown_key, unsupported_version, replay); on success the timestamp
    is recorded. ``own_mac1_key`` is :func:`raven.protocol.cookie.mac1_key` of our public
    key (a responder computes it once; without it it is derived here)."""
    _check_key("static_private", static_private)
    _check_key("psk", psk)
    if len(message) != INITIATION_BYTES:
        raise HandshakeRejected(
            f"initiation of {len(message)} bytes, expected {INITIATION_BYTES}", "malformed"
        )
    message = bytes(message)
    check_mac1(message, own_mac1_key or mac1_key(public_key(static_private)))  # before any DH
    state = HandshakeState.initialize(
        suite_protocol_name(suite),
        initiator=False,
        prologue=prologue(suite),
        s=static_private,
        e=ephemeral_private,
        psks=[psk],
    )
    try:
        payload = state.read_message(message[:NOISE_INITIATION_BYTES])
    except RemoteProtocolError as exc:
        if exc.code == CloseCode.AUTH_FAILED:
            raise HandshakeRejected(
                "initiation failed authentication (wrong gateway key or tampered)",
                "decrypt_failed",
            ) from None
        raise HandshakeRejected(f"malformed initiation: {exc}", "malformed") from None
    remote_static = state.remote_static
    if remote_static is None or len(payload) != INITIATION_PAYLOAD_BYTES:  # pragma: no cover
        raise HandshakeRejected("malformed initiation payload", "malformed")
    if not authorize(remote_static):
        raise HandshakeRejected("initiator key is not authorised", "unknown_key")
    timestamp, version = payload[:TIMESTAMP_BYTES], payload[TIMESTAMP_BYTES]
    if version != PROTOCOL_VERSION:
        raise HandshakeRejected(
            f"initiator speaks protocol version {version}, we speak {PROTOCOL_VERSION}",
            "unsupported_version",
        )
    if not replay_guard.is_fresh(remote_static, timestamp):
        raise HandshakeRejected("initiation timestamp is not newer than the last one", "replay")
    replay_guard.record(remote_static, timestamp)
    return ResponderHandshake(state, remote_static, timestamp, version, suite)


def create_response(
    handshake: ResponderHandshake, accepted: Collection[Suite] = (DEFAULT_SUITE,)
) -> tuple[bytes, SessionKeys]:
    """Message 2 (telling the initiator the ``accepted`` suites) and the responder's
    transport keys."""
    state = handshake.state
    if state.handshake_complete or not state.is_my_turn:
        raise LocalProtocolError("create_response called twice or out of order")
    message = state.write_message(bytes([encode_mask(accepted)]))
    to_responder, to_initiator = state.split()
    keys = SessionKeys(
        send=to_initiator,
        receive=to_responder,
        remote_static=handshake.remote_static,
        handshake_hash=state.get_handshake_hash(),
        suite=handshake.suite,
    )
    return message, keys


def consume_response(
    handshake: InitiatorHandshake, message: bytes | bytearray | memoryview
) -> SessionKeys:
    """Read message 2: the initiator's transport keys. A response that fails
    authentication (wrong PSK, another responder, tampered) raises
    HandshakeRejected ``decrypt_failed``; a wrong size ``malformed``."""
    state = handshake.state
    if state.handshake_complete or state.is_my_turn:
        raise LocalProtocolError("consume_response called twice or out of order")
    if len(message) != RESPONSE_BYTES:
        raise HandshakeRejected(
            f"response of {len(message)} bytes, expected {RESPONSE_BYTES}", "malformed"
        )
    try:
        payload = state.read_message(message)
    except RemoteProtocolError as exc:
        if exc.code == CloseCode.AUTH_FAILED:
            raise HandshakeRejected(
                "response failed authentication (wrong PSK or gateway key)", "decrypt_failed"
            ) from None
        raise HandshakeRejected(f"malformed response: {exc}", "malformed") from None
    if len(payload) != RESPONSE_PAYLOAD_BYTES:  # pragma: no cover - the size check above
        raise HandshakeRejected("response payload of the wrong size", "malformed")
    to_responder, to_initiator = state.split()
    return SessionKeys(
        send=to_responder,
        receive=to_initiator,
        remote_static=handshake.remote_static,
        handshake_hash=state.get_handshake_hash(),
        suite=handshake.suite,
        peer_suites=decode_mask(payload[0]),
    )
