"""mac1, mac2 and the cookie reply of the tunnel handshake (WireGuard whitepaper 5.4.4,
over TCP). Sans-IO: time is passed in as ``now``, randomness as ``random_bytes``.

Message 1 on the wire is the Noise message followed by two MACs::

    msg  = Noise message 1 (109 bytes)
    mac1 = MAC(HASH(LABEL_MAC1 || responder static public key), msg)
    mac2 = MAC(cookie, msg || mac1), or 16 zero bytes without a fresh cookie

mac1 proves the sender knows this gateway's public key: the gateway checks it before
any Diffie-Hellman. Under load the gateway answers an initiation whose mac2 is not
valid for its source address with a cookie reply instead of a DH::

    cookie = MAC(Rm, source IP bytes)         Rm: random, replaced every 120 s
    reply  = COOKIE_REPLY_TYPE (1) || nonce (24, random)
             || XChaCha20-Poly1305(HASH(LABEL_COOKIE || responder static), nonce, cookie,
                                   ad = mac1 of that initiation)

MAC is keyed BLAKE2s with a 16-byte digest, HASH is BLAKE2s-256. Layout and the
responder's order of checks: docs/protocol-handshake.md.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from raven.protocol.blake2s import bytes_eq, hash_, keyed_mac
from raven.protocol.constants import TAG_BYTES
from raven.protocol.errors import HandshakeRejected
from raven.protocol.xchacha import (
    XNONCE_BYTES,
    xchacha20poly1305_open,
    xchacha20poly1305_seal,
)

__all__ = [
    "COOKIE_BYTES",
    "COOKIE_REPLY_BYTES",
    "COOKIE_REPLY_TYPE",
    "COOKIE_SECRET_LIFETIME_S",
    "MACS_BYTES",
    "MAC_BYTES",
    "CookieJar",
    "CookieResponder",
    "append_macs",
    "check_mac1",
    "cookie_key",
    "mac",
    "mac1_key",
    "open_cookie_reply",
]

LABEL_MAC1 = b"mac1----"
LABEL_COOKIE = b"cookie--"
#: Size of mac1, mac2 and of a cookie.
MAC_BYTES = 16
COOKIE_BYTES = MAC_BYTES
#: mac1 || mac2, appended to the Noise message 1.
MACS_BYTES = 2 * MAC_BYTES
#: First byte of a cookie reply (as WireGuard's message type 3).
COOKIE_REPLY_TYPE = 0x03
#: type (1) + nonce (24) + encrypted cookie (16 + 16 tag) = 57 bytes.
COOKIE_REPLY_BYTES = 1 + XNONCE_BYTES + COOKIE_BYTES + TAG_BYTES
#: The responder's cookie secret Rm is replaced this often; an initiator keeps a
#: cookie this long (as WireGuard's REKEY_TIMEOUT-based cookie lifetime of 120 s).
COOKIE_SECRET_LIFETIME_S = 120.0

_NO_MAC2 = bytes(MAC_BYTES)
#: Rm's source by default: os.urandom (what secrets.token_bytes is).
_SYSTEM_RANDOM = random.SystemRandom()


def mac(key: bytes, data: bytes) -> bytes:
    """Keyed BLAKE2s, 16-byte digest."""
    return keyed_mac(key, data, MAC_BYTES)


def mac1_key(responder_static: bytes) -> bytes:
    """HASH(LABEL_MAC1 || responder static public key)."""
    return hash_(LABEL_MAC1 + responder_static)


def cookie_key(responder_static: bytes) -> bytes:
    """HASH(LABEL_COOKIE || responder static public key): encrypts cookie replies."""
    return hash_(LABEL_COOKIE + responder_static)


def append_macs(noise_message: bytes, key1: bytes, cookie: bytes | None) -> bytes:
    """``noise_message || mac1 || mac2`` (mac2 zero without a cookie)."""
    mac1 = mac(key1, noise_message)
    mac2 = mac(cookie, noise_message + mac1) if cookie is not None else _NO_MAC2
    return noise_message + mac1 + mac2


def check_mac1(message: bytes, key1: bytes) -> None:
    """Raise HandshakeRejected ``bad_mac1`` unless ``message`` (Noise message || mac1 ||
    mac2) carries a valid mac1: no Diffie-Hellman is spent on anything else."""
    if len(message) < MACS_BYTES:
        raise HandshakeRejected("initiation too short for its MACs", "malformed")
    body_end = len(message) - MACS_BYTES
    expected = mac(key1, message[:body_end])
    if not bytes_eq(expected, message[body_end : body_end + MAC_BYTES]):
        raise HandshakeRejected(
            "initiation has a bad mac1 (not made for this gateway's public key)", "bad_mac1"
        )


def _mac2_of(message: bytes, cookie: bytes) -> bool:
    mac2_at = len(message) - MAC_BYTES
    return bytes_eq(mac(cookie, message[:mac2_at]), message[mac2_at:])


class CookieResponder:
    """The gateway's side: mac1 key, the cookie secret Rm and the load rule, shared by all
    connections of a listener. ``under_load()`` says whether initiations must prove their
    address with a cookie (mac2) before any Diffie-Hellman."""

    def __init__(
        self,
        static_public: bytes,
        *,
        under_load: Callable[[], bool] | None = None,
        random_bytes: Callable[[int], bytes] = _SYSTEM_RANDOM.randbytes,
    ) -> None:
        self.mac1_key = mac1_key(static_public)
        self._cookie_key = cookie_key(static_public)
        self._under_load = under_load
        self._random = random_bytes
        self._secret: bytes | None = None
        self._secret_at = 0.0
        self._previous: bytes | None = None

    def under_load(self) -> bool:
        return self._under_load is not None and self._under_load()

    def _secrets(self, now: float) -> tuple[bytes, bytes | None]:
        """(current, previous) Rm; the current one is replaced once it is 120 s old, and
        the previous one is kept only while it is at most 240 s old."""
        age = now - self._secret_at
        if self._secret is None or age >= COOKIE_SECRET_LIFETIME_S:
            young = self._secret is not None and age < 2 * COOKIE_SECRET_LIFETIME_S
            self._previous = self._secret if young else None
            self._secret = self._random(32)
            self._secret_at = now
        return self._secret, self._previous

    def cookie(self, source: bytes, now: float) -> bytes:
        """The cookie of a source address under the current secret."""
        return mac(self._secrets(now)[0], source)

    def mac2_valid(self, message: bytes, source: bytes, now: float) -> bool:
        """Does ``message`` carry a mac2 made with a cookie of ``source`` from the current
        or the previous secret window?"""
        current, previous = self._secrets(now)
        if _mac2_of(message, mac(current, source)):
            return True
        return previous is not None and _mac2_of(message, mac(previous, source))

    def screen(self, message: bytes, source: bytes, now: float, *, replied: bool) -> bytes | None:
        """The checks before any Diffie-Hellman: mac1 (HandshakeRejected ``bad_mac1``),
        then the load rule. Returns None when the initiation may go on (not under load, or
        its mac2 is valid for ``source``), else the cookie reply to send; a connection that
        was ``replied`` to already and still has no valid mac2 is refused
        (``cookie_required``)."""
        check_mac1(message, self.mac1_key)
        if not self.under_load() or self.mac2_valid(message, source, now):
            return None
        if replied:
            raise HandshakeRejected(
                "initiation after a cookie reply still has no valid mac2", "cookie_required"
            )
        return self.reply(message, source, now)

    def reply(self, message: bytes, source: bytes, now: float) -> bytes:
        """The cookie reply to ``message`` (whose mac1 was checked) from ``source``."""
        mac1_at = len(message) - MACS_BYTES
        nonce = self._random(XNONCE_BYTES)
        sealed = xchacha20poly1305_seal(
            self._cookie_key,
            nonce,
            self.cookie(source, now),
            message[mac1_at : mac1_at + MAC_BYTES],
        )
        return bytes([COOKIE_REPLY_TYPE]) + nonce + sealed


def open_cookie_reply(reply: bytes, responder_static: bytes, mac1: bytes) -> bytes:
    """The cookie in a cookie reply to the initiation that carried ``mac1``. Raises
    HandshakeRejected ``bad_cookie_reply`` on a wrong size or type, or a reply that fails
    authentication (not from this gateway, or not for this initiation)."""
    if len(reply) != COOKIE_REPLY_BYTES or reply[0] != COOKIE_REPLY_TYPE:
        raise HandshakeRejected(
            f"cookie reply of {len(reply)} bytes (type {reply[:1]!r}), expected "
            f"{COOKIE_REPLY_BYTES} starting with {COOKIE_REPLY_TYPE}",
            "bad_cookie_reply",
        )
    nonce = bytes(reply[1 : 1 + XNONCE_BYTES])
    cookie = xchacha20poly1305_open(
        cookie_key(responder_static), nonce, bytes(reply[1 + XNONCE_BYTES :]), mac1
    )
    if cookie is None:
        raise HandshakeRejected(
            "cookie reply failed authentication (not this gateway or not our initiation)",
            "bad_cookie_reply",
        )
    return cookie


class CookieJar:
    """The initiator's side: the last cookie a gateway sent, kept 120 s. Share one jar
    across the reconnects to one gateway address (the cookie is bound to our address)."""

    __slots__ = ("_cookie", "_received_at", "received")

    def __init__(self) -> None:
        self._cookie: bytes | None = None
        self._received_at = 0.0
        #: cookie replies accepted so far
        self.received = 0

    def take_reply(self, reply: bytes, responder_static: bytes, mac1: bytes, now: float) -> None:
        """Open a cookie reply (see :func:`open_cookie_reply`) and keep its cookie."""
        self.put(open_cookie_reply(reply, responder_static, mac1), now)

    def put(self, cookie: bytes, now: float) -> None:
        self._cookie = bytes(cookie)
        self._received_at = now
        self.received += 1

    def cookie(self, now: float) -> bytes | None:
        """The cookie for mac2, or None once it is 120 s old."""
        if self._cookie is not None and now - self._received_at >= COOKIE_SECRET_LIFETIME_S:
            self._cookie = None
        return self._cookie
