"""Spec constants and protocol limits in one place (after wireguard-go's constants.go).

Durations end in ``_s`` and sizes in ``_bytes``. Values that operators may tune
live in :class:`raven.protocol.limits.Limits`; the ones here are fixed by the
wire format.
"""

from __future__ import annotations

#: Noise prologue: binds the handshake to this protocol and version (the suite byte follows it;
#: the Noise protocol names are the suites', raven.protocol.suites).
PROLOGUE = b"raven tunnel v2"
#: First bytes an initiator sends, before the first handshake message: "RVN" and the wire
#: version (2: message 1 carries mac1/mac2, a cookie reply may answer it).
MAGIC = b"RVN2"
#: Largest Noise message (spec section 3).
NOISE_MAX_MESSAGE_BYTES = 65535
#: ChaCha20-Poly1305 tag.
TAG_BYTES = 16
#: Every handshake message and record is prefixed by a big-endian length of this size.
LENGTH_PREFIX_BYTES = 2
#: Largest record plaintext (one record carries one or more frames).
MAX_RECORD_PLAINTEXT_BYTES = NOISE_MAX_MESSAGE_BYTES - TAG_BYTES
#: Largest frames payload of one record (the first plaintext byte is the record type).
MAX_RECORD_PAYLOAD_BYTES = MAX_RECORD_PLAINTEXT_BYTES - 1
#: Frame header: type u8, flags u8, stream_id u32, length u16.
FRAME_HEADER_BYTES = 8
#: Largest payload of a single frame.
MAX_FRAME_PAYLOAD_BYTES = MAX_RECORD_PAYLOAD_BYTES - FRAME_HEADER_BYTES
#: Size of the TAI64N timestamp in the initiator's first payload.
TIMESTAMP_BYTES = 12
#: Size of an X25519 key.
KEY_BYTES = 32
