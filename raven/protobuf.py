"""Protocol Buffers wire encoding, the two pieces our hand-written messages need: varints and
length-delimited fields (https://protobuf.dev/programming-guides/encoding/). Used by the
gateway's remote-write encoder and the GPU exporter's kubelet pod-resources messages."""

from __future__ import annotations


def encode_varint(n: int) -> bytes:
    """A varint; a negative value is an int64 in two's complement (10 bytes), as protobuf has it."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings, bytes and embedded messages."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload
