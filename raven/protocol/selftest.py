"""The start-up self-test: a handshake between two in-memory connections, per suite.

A gateway runs it before it opens its tunnel port (``cloud_gateway.app``), with its own static
key and PSK as the responder and a fresh key as the initiator, once for each suite it accepts:
a cipher library that cannot do a configured suite (a build without ChaCha20-Poly1305, a FIPS
policy refusing X25519) fails the start with the suite named, not the first agent's handshake.
It also takes the one-time cost of the cipher library's first use (its code paged in: about
0.7 MiB of RSS, measured in bench/bench_gateway_memory.py) out of the first agent's handshake.
Sans-IO: the clocks are the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence

from raven.protocol.connection import Role, TunnelConnection
from raven.protocol.events import HandshakeCompleted
from raven.protocol.limits import Limits
from raven.protocol.noise import generate_keypair, public_key
from raven.protocol.secure_channel import SecureChannel
from raven.protocol.suites import Suite

__all__ = ["SelfTestError", "handshake_selftest"]

#: More round trips than a handshake (with a cookie) takes: a test that needs more has failed.
_MAX_ROUNDS = 8


class SelfTestError(Exception):
    """The in-memory handshake did not complete for a suite (named in the message)."""


def handshake_selftest(
    static_private: bytes,
    *,
    psk: bytes,
    suites: Sequence[Suite],
    limits: Limits,
    now: float,
    wall_time_ns: int,
) -> None:
    """Complete one handshake per suite in ``suites`` against ``static_private`` (the
    responder, accepting ``suites``); raises :class:`SelfTestError` when one does not."""
    own_public = public_key(static_private)
    for suite in suites:
        try:
            done = _one_handshake(static_private, own_public, suite, psk=psk, accepted=suites,
                                  limits=limits, now=now, wall_time_ns=wall_time_ns)  # fmt: skip
        except Exception as exc:
            raise SelfTestError(f"suite {suite.label}: {exc}") from exc
        if not done:
            raise SelfTestError(f"suite {suite.label}: the handshake did not complete")


def _one_handshake(
    static_private: bytes,
    own_public: bytes,
    suite: Suite,
    *,
    psk: bytes,
    accepted: Sequence[Suite],
    limits: Limits,
    now: float,
    wall_time_ns: int,
) -> bool:
    agent_private, agent_public = generate_keypair()
    initiator = SecureChannel(
        role=Role.INITIATOR,
        static_private=agent_private,
        limits=limits,
        now=now,
        remote_static=own_public,
        psk=psk,
        wall_time_ns=wall_time_ns,
        suites=(suite,),
    )
    responder = SecureChannel(
        role=Role.RESPONDER,
        static_private=static_private,
        limits=limits,
        now=now,
        psk=psk,
        authorize=lambda key: key == agent_public,
        suites=accepted,
    )
    agent, gateway = TunnelConnection(initiator), TunnelConnection(responder)
    _exchange(agent, gateway, now)
    return _completed(agent, own_public) and _completed(gateway, agent_public)


def _exchange(a: TunnelConnection, b: TunnelConnection, now: float) -> None:
    for _ in range(_MAX_ROUNDS):
        x, y = a.data_to_send(None, now), b.data_to_send(None, now)
        if not x and not y:
            return
        if x:
            b.receive_data(x, now)
        if y:
            a.receive_data(y, now)


def _completed(conn: TunnelConnection, peer: bytes) -> bool:
    while (event := conn.next_event()) is not None:
        if isinstance(event, HandshakeCompleted):
            return event.remote_static == peer
    return False
