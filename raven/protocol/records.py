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
- ``0x02`` HANDSHAKE: a message of a re-handshake (a fresh Noise handshake inside the
  session, for new Diffie-Hellman keys; see SecureChannel);
- ``0x03`` SWITCH: empty; the sender's next records use the re-handshake's new key.

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
    MAX_RECORD_PAYLOAD_BYTES,
    MAX_RECORD_PLAINTEXT_BYTES,
    TAG_BYTES,
)
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.noise import CipherState

__all__ = [
    "MAX_RECORD_PAYLOAD_BYTES",
    "MIN_RECORD_BYTES",
    "OutputBuffer",
    "RecordReceiver",
    "RecordSender",
    "RecordType",
    "split_messages",
]

#: Smallest record ciphertext: the type byte and the tag.
MIN_RECORD_BYTES = 1 + TAG_BYTES

_EMPTY = b""
#: Scratch buffers start empty (this one, shared: it is never written, any use grows it
#: first), so an idle or trimmed tunnel holds none of its own.
_NO_SCRATCH = memoryview(bytearray())
#: Records up to this size are sealed from and opened into a plaintext of their own (fewer
#: steps, and no scratch buffer kept by a tunnel that only exchanges keepalives); larger ones
#: go through the sender's and receiver's scratch buffers (no allocation of a whole record).
SMALL_RECORD_BYTES = 2048


def _grown(scratch: memoryview, needed: int) -> memoryview:
    """A bigger scratch buffer: at least ``needed`` bytes, doubling, capped at a record."""
    size = min(max(needed, 2 * len(scratch)), MAX_RECORD_PLAINTEXT_BYTES + TAG_BYTES)
    return memoryview(bytearray(size))


class RecordType(enum.IntEnum):
    """First plaintext byte of a record."""

    FRAMES = 0x00
    KEY_UPDATE = 0x01
    HANDSHAKE = 0x02
    SWITCH = 0x03


#: The type byte of each record type, as bytes (a small record's plaintext is built on it).
_TYPE_BYTES = tuple(bytes([kind]) for kind in range(max(RecordType) + 1))
#: The type byte of a FRAMES record, for :meth:`RecordSender.seal_now`.
_FRAMES_TYPE = _TYPE_BYTES[RecordType.FRAMES]


class OutputBuffer:
    """Wire bytes waiting to be sent, in one reusable bytearray.

    Sealing a record writes its ciphertext straight into the buffer (no
    allocation per record); :meth:`take` copies the queued bytes out once per
    batch. Capacity starts at ``initial_bytes`` (none by default: it is allocated by
    the first record, so thousands of idle tunnels cost little),
    doubles as needed, is kept while it is at most ``keep_bytes`` (bulk traffic
    reuses it) and shrinks back after a larger batch.
    """

    __slots__ = ("_buf", "_initial", "_keep", "used")

    def __init__(self, initial_bytes: int = 0, keep_bytes: int = 1024 * 1024) -> None:
        self._buf = bytearray(initial_bytes)
        self._initial = initial_bytes
        self._keep = keep_bytes
        #: bytes queued (read it; only the methods change it)
        self.used = 0

    def __len__(self) -> int:
        return self.used

    def reserve(self, size: int) -> memoryview:
        """A writable view of the next ``size`` bytes, now counted as queued.
        Release the view (``with``) before the next call."""
        start = self.used
        end = start + size
        if end > len(self._buf):
            self._buf += bytes(max(end - len(self._buf), len(self._buf)))
        self.used = end
        return memoryview(self._buf)[start:end]

    def unreserve(self, size: int) -> None:
        """Give back the last ``size`` reserved bytes (a seal that failed)."""
        self.used -= size

    def append(self, data: bytes) -> None:
        with self.reserve(len(data)) as view:
            view[:] = data

    def discard(self) -> int:
        """Forget everything queued (a channel that failed); the number of bytes dropped."""
        dropped, self.used = self.used, 0
        return dropped

    def trim(self) -> None:
        """Drop the buffer's memory when nothing is queued (an idle tunnel)."""
        if not self.used:
            self._buf = bytearray()

    def take(self) -> bytes:
        """All queued bytes (empty when none); the buffer is then empty."""
        used = self.used
        if not used:
            return b""
        with memoryview(self._buf) as view:
            data = view[:used].tobytes()
        self.used = 0
        if len(self._buf) > self._keep:
            self._buf = bytearray(self._initial)
        return data


class RecordSender:
    """Seals records under the sending key and rotates it when the limits say so."""

    __slots__ = (
        "_after_records",
        "_after_s",
        "_cipher",
        "_key_records",
        "_key_since",
        "_plain",
        "records",
        "rekeys",
    )

    def __init__(
        self, cipher: CipherState, *, rekey_after_records: int, rekey_after_s: float, now: float
    ) -> None:
        if not cipher.has_key():  # an unkeyed CipherState passes plaintext through (Noise)
            raise ValueError("records need a keyed CipherState")
        if rekey_after_records < 1:
            raise ValueError("rekey_after_records must be at least 1")
        self._cipher = cipher
        self._after_records = rekey_after_records
        self._after_s = rekey_after_s
        self._key_records = 0  # records sealed under the current key
        self._key_since = now
        # type byte + payload are assembled here, then encrypted into the output
        # (grown on demand up to MAX_RECORD_PLAINTEXT_BYTES: idle tunnels stay small)
        self._plain = _NO_SCRATCH
        #: records sealed (key updates included) and keys rotated
        self.records = 0
        self.rekeys = 0

    def seal(self, payload: bytes | memoryview, now: float, out: OutputBuffer) -> int:
        """Append the wire bytes of one FRAMES record (preceded by a KEY_UPDATE record
        when the key is due) to ``out``; return the number of bytes appended."""
        size = len(payload)
        if size > MAX_RECORD_PAYLOAD_BYTES:
            raise LocalProtocolError(
                f"record payload of {size} bytes exceeds {MAX_RECORD_PAYLOAD_BYTES}"
            )
        written = 0
        if self._key_records >= self._after_records or now - self._key_since >= self._after_s:
            written = self._seal_type(RecordType.KEY_UPDATE, b"", out)
            self._cipher.rekey()
            self._cipher.set_nonce(0)
            self._key_records = 0
            self._key_since = now
            self.rekeys += 1
        return written + self._seal_type(RecordType.FRAMES, payload, out)

    def seal_now(self, head: bytes, body: bytes, now: float) -> bytes | None:
        """The wire bytes of one FRAMES record carrying ``head + body``, returned rather
        than queued (the datagram lane: nothing may be queued before it); None, nothing
        done, when the key is due for an update (:meth:`seal` sends that first)."""
        if self._key_records >= self._after_records or now - self._key_since >= self._after_s:
            return None
        ciphertext = self._cipher.encrypt_with_ad(_EMPTY, _FRAMES_TYPE + head + body)
        self._key_records += 1
        self.records += 1
        return len(ciphertext).to_bytes(LENGTH_PREFIX_BYTES, "big") + ciphertext

    def trim(self) -> None:
        """Release what an idle sender does not need: the AEAD object, the scratch buffer."""
        self._cipher.release()
        self._plain = _NO_SCRATCH

    def seal_control(self, kind: RecordType, payload: bytes, out: OutputBuffer) -> int:
        """Append one HANDSHAKE or SWITCH record (never preceded by a key update)."""
        return self._seal_type(kind, payload, out)

    def _seal_type(self, kind: int, payload: bytes | memoryview, out: OutputBuffer) -> int:
        size = len(payload)
        plain: bytes | memoryview
        if size < SMALL_RECORD_BYTES:  # a PING, a credit, a request: no scratch kept for it
            plain = _TYPE_BYTES[kind] + payload
        else:
            plain = self._plain
            if size >= len(plain):
                plain = self._plain = _grown(plain, size + 1)
            plain[0] = kind
            plain[1 : 1 + size] = payload
            plain = plain[: 1 + size]
        ciphertext_size = 1 + size + TAG_BYTES
        with out.reserve(LENGTH_PREFIX_BYTES + ciphertext_size) as view:
            view[0] = ciphertext_size >> 8
            view[1] = ciphertext_size & 0xFF
            try:
                self._cipher.encrypt_with_ad_into(_EMPTY, plain, view[LENGTH_PREFIX_BYTES:])
            except BaseException:
                out.unreserve(LENGTH_PREFIX_BYTES + ciphertext_size)
                raise
        self._key_records += 1
        self.records += 1
        return LENGTH_PREFIX_BYTES + ciphertext_size


class RecordReceiver:
    """Opens records under the receiving key; follows the peer's key updates."""

    __slots__ = ("_cipher", "_scratch", "control", "records", "rekeys")

    def __init__(self, cipher: CipherState) -> None:
        if not cipher.has_key():  # an unkeyed CipherState passes ciphertext through (Noise)
            raise ValueError("records need a keyed CipherState")
        self._cipher = cipher
        # a bulk record's plaintext lands here first (decrypt_into), then one copy out:
        # cheaper than a fresh plaintext per record plus a slice without its type byte
        self._scratch = _NO_SCRATCH
        self.records = 0
        self.rekeys = 0
        #: the last HANDSHAKE or SWITCH record read: (type, payload), for the channel
        self.control: tuple[RecordType, bytes] | None = None

    def trim(self) -> None:
        """Release what an idle receiver does not need: the AEAD object, the scratch buffer."""
        self._cipher.release()
        self._scratch = _NO_SCRATCH

    def open(self, ciphertext: bytes | memoryview) -> bytes | None:
        """The frames payload of one record, or None for a key update or a HANDSHAKE /
        SWITCH record (then in :attr:`control`).

        A record that fails authentication raises RemoteProtocolError with
        ``code=CloseCode.AUTH_FAILED``; an unknown type or a key update with a
        payload raises RemoteProtocolError (PROTOCOL_ERROR)."""
        size = len(ciphertext)
        if not MIN_RECORD_BYTES <= size <= MAX_RECORD_PLAINTEXT_BYTES + TAG_BYTES:
            raise RemoteProtocolError(f"record of {size} bytes has an invalid size")
        plain: bytes | memoryview
        try:
            if size <= SMALL_RECORD_BYTES:  # an L3 packet, a request: one plaintext, no views
                plain = self._cipher.decrypt_with_ad(_EMPTY, ciphertext)
            else:  # bulk: into the scratch buffer, then one copy out of it
                scratch = self._scratch
                if size > len(scratch):
                    scratch = self._scratch = _grown(scratch, size)
                # (the size first, then the slice: mypyc evaluates a slice's bound twice)
                opened = self._cipher.decrypt_with_ad_into(_EMPTY, ciphertext, scratch)
                plain = scratch[:opened]
        except RemoteProtocolError:
            raise RemoteProtocolError(
                "a record failed authentication", CloseCode.AUTH_FAILED
            ) from None
        self.records += 1
        kind = plain[0]
        if kind == RecordType.FRAMES:
            return bytes(plain[1:])  # a slice of bytes already is a copy: bytes() keeps it
        if kind == RecordType.KEY_UPDATE:
            if len(plain) != 1:
                raise RemoteProtocolError("key update record with a payload")
            self._cipher.rekey()
            self._cipher.set_nonce(0)
            self.rekeys += 1
            return None
        if kind in (RecordType.HANDSHAKE, RecordType.SWITCH):
            self.control = (RecordType(kind), bytes(plain[1:]))
            return None
        raise RemoteProtocolError(f"unknown record type 0x{kind:02x}")


def trim_idle(
    sender: RecordSender | None, receiver: RecordReceiver | None, out: OutputBuffer
) -> None:
    """Release what an idle channel's record layer does not need (see each ``trim``)."""
    out.trim()
    if sender is not None:
        sender.trim()
    if receiver is not None:
        receiver.trim()


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
