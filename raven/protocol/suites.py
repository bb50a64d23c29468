"""Transport suites: which Noise protocol a tunnel handshake runs, and how the ends agree.

A suite is a whole Noise protocol name, so each handshake runs entirely under one name:

- ``Suite.CHACHAPOLY`` (1): ``Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s``, the default;
- ``Suite.AESGCM`` (2): ``Noise_IKpsk2_25519_AESGCM_BLAKE2s``, for CPUs with AES instructions.

Negotiation (docs/protocol-handshake.md): the initiator names the suite of each handshake in
clear, in the byte after the magic (:func:`preamble`) or before message 1 of a re-handshake;
the byte is also bound into the prologue, and the protocol name differs per suite, so a changed
byte fails the handshake. The responder's message 2 carries the suites it accepts (a bit mask,
encrypted and authenticated by the handshake); the initiator's next handshake (a re-handshake
in the tunnel or a reconnect) runs the first suite of its own preference that the responder
accepts. Nothing that picks a suite travels unauthenticated, so no downgrade is possible: an
attacker can only make a handshake fail.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence

from raven.protocol.channel_types import check_magic
from raven.protocol.constants import MAGIC, PROLOGUE
from raven.protocol.errors import HandshakeRejected

__all__ = [
    "DEFAULT_SUITE",
    "DEFAULT_SUITES",
    "PREAMBLE_BYTES",
    "ChannelSuites",
    "Suite",
    "accept_suite",
    "choose",
    "decode_mask",
    "encode_mask",
    "first_suite",
    "preamble",
    "prologue",
    "protocol_name",
    "split_suite",
    "suite_by_name",
]


class Suite(enum.IntEnum):
    """A transport suite; the value is its byte on the wire (0 is never a suite)."""

    CHACHAPOLY = 1
    AESGCM = 2

    @property
    def label(self) -> str:
        """The name in configuration, metrics and the admin API."""
        return _LABELS[self]


_LABELS = {Suite.CHACHAPOLY: "chacha20-poly1305", Suite.AESGCM: "aes-256-gcm"}
_NOISE_CIPHERS = {Suite.CHACHAPOLY: "ChaChaPoly", Suite.AESGCM: "AESGCM"}

#: The suite every peer accepts and an initiator that knows nothing better starts with.
DEFAULT_SUITE = Suite.CHACHAPOLY
#: The suites a channel accepts unless told otherwise.
DEFAULT_SUITES = (DEFAULT_SUITE,)
#: What an initiator sends before its first handshake message: MAGIC and the suite byte.
PREAMBLE_BYTES = len(MAGIC) + 1


def suite_by_name(name: str) -> Suite:
    """The suite of a configuration name (ValueError naming the valid ones)."""
    for suite, label in _LABELS.items():
        if label == name:
            return suite
    raise ValueError(f"unknown transport suite {name!r}: one of {', '.join(_LABELS.values())}")


def protocol_name(suite: Suite) -> bytes:
    """The Noise protocol name the handshake of ``suite`` runs."""
    return f"Noise_IKpsk2_25519_{_NOISE_CIPHERS[suite]}_BLAKE2s".encode("ascii")


def prologue(suite: Suite) -> bytes:
    """The Noise prologue: the protocol version and the suite byte sent in clear."""
    return PROLOGUE + bytes([suite])


def encode_mask(suites: Iterable[Suite]) -> int:
    """The one-byte set of suites in message 2: bit ``suite - 1`` per suite."""
    mask = 0
    for suite in suites:
        mask |= 1 << (suite - 1)
    return mask


def decode_mask(mask: int) -> frozenset[Suite]:
    """The suites of a mask; bits of suites this version does not know are ignored."""
    return frozenset(suite for suite in Suite if mask & (1 << (suite - 1)))


def choose(preference: Sequence[Suite], accepted: Collection[Suite]) -> Suite | None:
    """The first suite of ``preference`` that the peer accepts (None: no common suite)."""
    for suite in preference:
        if suite in accepted:
            return suite
    return None


def first_suite(preference: Sequence[Suite], peer_suites: Collection[Suite] | None) -> Suite:
    """The suite of an initiator's first handshake: the best one the peer accepts as far
    as known (unknown: it accepts the default), else our own first choice (the peer will
    then refuse it, with reason ``unsupported_suite`` in its logs and metrics)."""
    known = peer_suites if peer_suites is not None else (DEFAULT_SUITE,)
    chosen = choose(preference, known)
    return chosen if chosen is not None else preference[0]


def preamble(suite: Suite) -> bytes:
    """MAGIC and the suite byte: the initiator's first bytes on a new connection."""
    return MAGIC + bytes([suite])


def accept_suite(code: int, accepted: Collection[Suite]) -> Suite:
    """The suite an initiator named, if we accept it; else HandshakeRejected
    ``unsupported_suite`` with a reason an operator can act on."""
    if code == 0:
        raise HandshakeRejected(
            "no transport suite byte after the magic: the agent is older than suite "
            "negotiation (upgrade it)",
            "unsupported_suite",
        )
    suite = next((s for s in Suite if s == code), None)
    if suite is None or suite not in accepted:
        name = suite.label if suite is not None else f"unknown suite {code}"
        wanted = ", ".join(s.label for s in Suite if s in accepted)
        raise HandshakeRejected(
            f"initiator asked for {name}; this side accepts {wanted} (an agent with cipher: "
            f"{name} needs a gateway whose transport_suites lists it)",
            "unsupported_suite",
        )
    return suite


def split_suite(message: bytes, accepted: Collection[Suite]) -> tuple[Suite, bytes]:
    """A re-handshake's message 1 record body: (its suite, the Noise message)."""
    if not message:
        raise HandshakeRejected("empty re-handshake record", "malformed")
    return accept_suite(message[0], accepted), message[1:]


class ChannelSuites:
    """One channel's suites: those it accepts (an initiator's in order of preference), the
    one its current keys use, the one an initiator named before its message 1 (responder)
    and those the responder accepts (initiator, from message 2; None: not known yet)."""

    __slots__ = ("accepted", "current", "offered", "peer")

    def __init__(self, accepted: Sequence[Suite], peer: Collection[Suite] | None) -> None:
        if not accepted:
            raise ValueError("suites must name at least one transport suite")
        self.accepted = tuple(accepted)
        self.current: Suite | None = None
        self.offered = DEFAULT_SUITE
        self.peer = frozenset(peer) if peer is not None else None

    def read_preamble(self, view: memoryview) -> int:
        """(responder) A connection's first bytes: MAGIC (else check_magic names what
        connected) and an accepted suite byte, then :attr:`offered`. Returns the bytes
        used, 0 while the preamble is incomplete."""
        if len(view) >= len(MAGIC):
            check_magic(bytes(view[: len(MAGIC)]))
        if len(view) < PREAMBLE_BYTES:
            return 0
        self.offered = accept_suite(view[len(MAGIC)], self.accepted)
        return PREAMBLE_BYTES

    def split(self, message: bytes) -> tuple[Suite, bytes]:
        """(responder) A re-handshake's message 1 record: (its accepted suite, message 1)."""
        return split_suite(message, self.accepted)

    def adopt(self, suite: Suite, peer: frozenset[Suite] | None) -> None:
        """A handshake of ``suite`` completed; an initiator learnt the responder's ``peer``."""
        self.current = suite
        if peer is not None:
            self.peer = peer

    def better(self) -> Suite | None:
        """(initiator) The suite the next handshake should run, when it is not the current
        one: the first of ours the responder accepts."""
        wanted = choose(self.accepted, self.peer or ())
        return wanted if wanted is not None and wanted != self.current else None

    def next(self) -> Suite:
        """(initiator) The suite of the next handshake."""
        if self.current is None:
            return first_suite(self.accepted, self.peer)
        return self.better() or self.current
