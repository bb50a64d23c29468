"""The record layer: Noise transport messages over an ordered byte stream.

Every record on the wire is ``u16 length (big-endian) || ciphertext``; the
ciphertext is ChaCha20-Poly1305 of ``type (1 byte) || payload`` under the
sending direction's key, with an implicit nonce: the count of records already
sent under that key (TCP is ordered, so both ends count alike; a nonce is never
reused). Types:

- ``0x00`` FRAMES: the payload is one or more frames (docs/protocol.md);
- ``0x01`` KEY_UPDATE: empty payload; after it the sender's key is replaced by
  ``REKEY(k)`` and its counter restarts at zero. The receiver does the same to its
  receiving key when it reads one.

:class:`RecordSender` decides when to rekey (``Limits.rekey_after_records`` /
``rekey_after_s``); :class:`RecordReceiver` opens records; :func:`split_messages`
cuts length-prefixed messages out of a buffer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from raven.protocol.codes import CloseCode
from raven.protocol.constants import (
    LENGTH_PREFIX_BYTES,
    MAX_RECORD_PLAINTEXT_BYTES,
    TAG_BYTES,
)
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.noise import CipherState

__all__ = [
    "MAX_RECORD_PAYLOAD_BYTES",
    "MIN_RECORD_BYTES",
    "RecordReceiver",
    "RecordSender",
    "RecordType",
    "split_messages",
]

#: Largest frames payload of one record (one byte goes to the record type).
MAX_RECORD_PAYLOAD_BYTES = MAX_RECORD_PLAINTEXT_BYTES - 1
#: Smallest record ciphertext: the type byte and the tag.
MIN_RECORD_BYTES = 1 + TAG_BYTES

_EMPTY = b""
_FRAMES = b"\x00"
_KEY_UPDATE = b"\x01"


class RecordType(enum.IntEnum):
    """First plaintext byte of a record."""

    FRAMES = 0x00
    KEY_UPDATE = 0x01


def _prefix(length: int) -> bytes:
    return length.to_bytes(LENGTH_PREFIX_BYTES, "big")


class RecordSender:
    """Seals records under the sending key and rotates it when the limits say so."""

    __slots__ = (
        "_after_records",
        "_after_s",
        "_cipher",
        "_key_records",
        "_key_since",
        "records",
        "rekeys",
    )

    def __init__(
        self, cipher: CipherState, *, rekey_after_records: int, rekey_after_s: float, now: float
    ) -> None:
        if rekey_after_records < 1:
            raise ValueError("rekey_after_records must be at least 1")
        self._cipher = cipher
        self._after_records = rekey_after_records
        self._after_s = rekey_after_s
        self._key_records = 0  # records sealed under the current key
        self._key_since = now
        #: records sealed (key updates included) and keys rotated
        self.records = 0
        self.rekeys = 0

    def seal(self, payload: bytes | memoryview, now: float, out: list[bytes]) -> int:
        """Append the wire bytes of one FRAMES record (preceded by a KEY_UPDATE record
        when the key is due) to ``out``; return the number of bytes appended."""
        if len(payload) > MAX_RECORD_PAYLOAD_BYTES:
            raise LocalProtocolError(
                f"record payload of {len(payload)} bytes exceeds {MAX_RECORD_PAYLOAD_BYTES}"
            )
        written = 0
        if self._key_records >= self._after_records or now - self._key_since >= self._after_s:
            written = self._rekey(now, out)
        ciphertext = self._cipher.encrypt_with_ad(_EMPTY, _FRAMES + payload)
        out.append(_prefix(len(ciphertext)))
        out.append(ciphertext)
        self._key_records += 1
        self.records += 1
        return written + LENGTH_PREFIX_BYTES + len(ciphertext)

    def _rekey(self, now: float, out: list[bytes]) -> int:
        ciphertext = self._cipher.encrypt_with_ad(_EMPTY, _KEY_UPDATE)
        out.append(_prefix(len(ciphertext)) + ciphertext)
        self._cipher.rekey()
        self._cipher.set_nonce(0)
        self._key_records = 0
        self._key_since = now
        self.records += 1
        self.rekeys += 1
        return LENGTH_PREFIX_BYTES + len(ciphertext)


class RecordReceiver:
    """Opens records under the receiving key; follows the peer's key updates."""

    __slots__ = ("_cipher", "_scratch", "records", "rekeys")

    def __init__(self, cipher: CipherState) -> None:
        self._cipher = cipher
        # plaintext lands here first (decrypt_into), then one copy out: cheaper than
        # a fresh plaintext per record plus a slice without its type byte
        self._scratch = memoryview(bytearray(MAX_RECORD_PLAINTEXT_BYTES))
        self.records = 0
        self.rekeys = 0

    def open(self, ciphertext: bytes | memoryview) -> bytes | None:
        """The frames payload of one record, or None for a key update.

        A record that fails authentication raises RemoteProtocolError with
        ``code=CloseCode.AUTH_FAILED``; an unknown type or a key update with a
        payload raises RemoteProtocolError (PROTOCOL_ERROR)."""
        if not MIN_RECORD_BYTES <= len(ciphertext) <= MAX_RECORD_PLAINTEXT_BYTES + TAG_BYTES:
            raise RemoteProtocolError(f"record of {len(ciphertext)} bytes has an invalid size")
        scratch = self._scratch
        try:
            size = self._cipher.decrypt_with_ad_into(_EMPTY, ciphertext, scratch)
        except RemoteProtocolError:
            raise RemoteProtocolError(
                "a record failed authentication", CloseCode.AUTH_FAILED
            ) from None
        self.records += 1
        kind = scratch[0]
        if kind == RecordType.FRAMES:
            return scratch[1:size].tobytes()
        if kind == RecordType.KEY_UPDATE:
            if size != 1:
                raise RemoteProtocolError("key update record with a payload")
            self._cipher.rekey()
            self._cipher.set_nonce(0)
            self.rekeys += 1
            return None
        raise RemoteProtocolError(f"unknown record type 0x{kind:02x}")


def split_messages(
    view: memoryview,
    handle: Callable[[memoryview], bool],
    check_length: Callable[[int], None] | None = None,
) -> int:
    """Call ``handle`` on each complete u16-length-prefixed message in ``view``.

    ``handle`` returns False to stop early (e.g. the phase changed and the rest
    must be read differently). ``check_length`` is called on every length prefix
    as soon as it is seen (before the body arrived) so that a bad length fails
    fast. Returns the number of bytes consumed; the rest is at most one partial
    message.
    """
    offset = 0
    end = len(view)
    while end - offset >= LENGTH_PREFIX_BYTES:
        length = (view[offset] << 8) | view[offset + 1]
        if check_length is not None:
            check_length(length)
        stop = offset + LENGTH_PREFIX_BYTES + length
        if stop > end:
            break
        message = view[offset + LENGTH_PREFIX_BYTES : stop]
        offset = stop
        try:
            go_on = handle(message)
        finally:
            message.release()
        if not go_on:
            break
    return offset
