"""The variable-length fields frames carry, validated both ways: reason texts, node names,
IP prefixes and registration entries (kind u8, length u8, bytes).

Encoders raise :class:`LocalProtocolError` for values our own code should never produce;
decoders raise :class:`RemoteProtocolError` for anything a peer should not have sent.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.names import is_valid_node_name, normalize_node_name

#: Longest reason text on the wire (UTF-8 bytes); longer ones are cut when encoding.
MAX_REASON_BYTES = 255


#: Longest IP prefix text in a registration (``ffff:...:ffff/128`` is 43).
MAX_PREFIX_BYTES = 64


_ENTRY_HEAD = struct.Struct(">BB")  # kind, length


_PREFIX_CHARS = re.compile(r"[0-9A-Fa-f:./]+")


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


ENTRY_NODE = 0


ENTRY_PREFIX = 1


ENTRY_REFUSED = 2


def clean_reason(reason: str) -> str:
    """Reason text as it goes on the wire and into logs: control characters become
    ``?`` and the UTF-8 form is cut to :data:`MAX_REASON_BYTES` (on a character boundary)."""
    reason = _UNPRINTABLE.sub("?", reason)
    raw = reason.encode("utf-8", "replace")
    if len(raw) <= MAX_REASON_BYTES:
        return reason
    return raw[:MAX_REASON_BYTES].decode("utf-8", "ignore")


def encode_reason(reason: str) -> bytes:
    return clean_reason(reason).encode("utf-8", "replace")


def decode_reason(raw: bytes) -> str:
    if len(raw) > MAX_REASON_BYTES:
        raise RemoteProtocolError(f"reason longer than {MAX_REASON_BYTES} bytes")
    return _UNPRINTABLE.sub("?", raw.decode("utf-8", "replace"))


def check_node_name(node: str) -> str:
    """Validate and normalise a node name for sending; LocalProtocolError if invalid."""
    if not is_valid_node_name(node):
        raise LocalProtocolError(f"invalid node name {node[:80]!r}")
    return normalize_node_name(node)


def check_prefix(prefix: str) -> str:
    """Check an IP prefix's text form for sending (its meaning is checked by the gateway)."""
    if len(prefix) > MAX_PREFIX_BYTES or not _PREFIX_CHARS.fullmatch(prefix):
        raise LocalProtocolError(f"invalid IP prefix {prefix[:80]!r}")
    return prefix


def decode_node(raw: bytes) -> str:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("node name is not ASCII") from None
    if not is_valid_node_name(text):
        raise RemoteProtocolError("invalid node name")
    return normalize_node_name(text)


def decode_prefix(raw: bytes) -> str:
    if len(raw) > MAX_PREFIX_BYTES:
        raise RemoteProtocolError("IP prefix too long")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("IP prefix is not ASCII") from None
    if not _PREFIX_CHARS.fullmatch(text):
        raise RemoteProtocolError("invalid IP prefix")
    return text


def encode_entry(kind: int, raw: bytes) -> bytes:
    return _ENTRY_HEAD.pack(kind, len(raw)) + raw


def encode_entries(kind: int, values: Iterable[str], check: Callable[[str], str]) -> bytes:
    return b"".join(encode_entry(kind, check(value).encode("ascii")) for value in values)


def encode_refused(entry: str, reason: str) -> bytes:
    raw_entry = encode_reason(entry)
    raw_reason = encode_reason(reason)
    return encode_entry(ENTRY_REFUSED, raw_entry) + bytes((len(raw_reason),)) + raw_reason


def read_entries(
    body: bytes, *, result: bool
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    nodes: list[str] = []
    prefixes: list[str] = []
    refused: list[tuple[str, str]] = []
    offset = 0
    total = len(body)
    while offset < total:
        if total - offset < 2:
            raise RemoteProtocolError("truncated registration entry")
        kind, length = _ENTRY_HEAD.unpack_from(body, offset)
        offset += 2
        raw = body[offset : offset + length]
        offset += length
        if len(raw) != length or length == 0:
            raise RemoteProtocolError("bad registration entry length")
        if kind == ENTRY_NODE:
            nodes.append(decode_node(raw))
        elif kind == ENTRY_PREFIX:
            prefixes.append(decode_prefix(raw))
        elif kind == ENTRY_REFUSED and result:
            if offset >= total:
                raise RemoteProtocolError("truncated refused entry")
            reason_len = body[offset]
            reason = body[offset + 1 : offset + 1 + reason_len]
            offset += 1 + reason_len
            if len(reason) != reason_len:
                raise RemoteProtocolError("truncated refusal reason")
            refused.append((decode_reason(raw), decode_reason(reason)))
        else:
            raise RemoteProtocolError(f"unknown registration entry kind {kind}")
    return nodes, prefixes, refused
