"""Sans-IO TLS ClientHello peek: the server name (SNI) a client asks for (RFC 8446, RFC 6066).

:func:`extract_sni` looks at the first bytes a TLS client sent and returns the host name, or None
while more bytes are needed. A ClientHello split over several handshake records is reassembled.
Bounded by ``max_bytes``; anything that is not a ClientHello with a host name raises
:class:`ClientHelloError` and nothing else. The bytes are never consumed: the caller relays all
of them, untouched, to the target (TLS is not terminated here).
"""

from __future__ import annotations

from cloud_gateway.proxy.errors import ClientHelloError

#: Default bound on the bytes peeked before giving up.
MAX_CLIENT_HELLO_BYTES = 32768
_RECORD_HANDSHAKE = 0x16
_HANDSHAKE_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
_NAME_TYPE_HOST = 0x00
_MAX_RECORD_BYTES = 16384 + 2048


class _Cursor:
    """Reads big-endian fields from a buffer; running off the end is a ClientHelloError."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise ClientHelloError(f"truncated {self.what}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, len_size: int) -> bytes:
        return self.take(self.uint(len_size))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _hello_size(payload: bytes | bytearray, max_bytes: int) -> int | None:
    """Size of the ClientHello message once its 4-byte header is there (checked)."""
    if len(payload) < 4:
        return None
    if payload[0] != _HANDSHAKE_CLIENT_HELLO:
        raise ClientHelloError("first handshake message is not a ClientHello")
    need = 4 + int.from_bytes(payload[1:4], "big")
    if need > max_bytes:
        raise ClientHelloError(f"ClientHello larger than {max_bytes} bytes")
    return need


def _handshake_bytes(data: bytes, max_bytes: int) -> bytes | None:
    """Concatenated handshake-record payloads, once a whole ClientHello is there."""
    payload = bytearray()
    pos = 0
    while True:
        need = _hello_size(payload, max_bytes)
        if need is not None and len(payload) >= need:
            return bytes(payload[:need])
        if len(data) - pos < 5:
            break
        if data[pos] != _RECORD_HANDSHAKE:
            raise ClientHelloError("not a TLS handshake record")
        if data[pos + 1] != 0x03:
            raise ClientHelloError("not a TLS record version")
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0 or length > _MAX_RECORD_BYTES:
            raise ClientHelloError("invalid TLS record length")
        if len(data) - pos - 5 < length:
            _hello_size(payload + data[pos + 5 :], max_bytes)  # fail early on a bad header
            break
        payload += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
    if len(data) > max_bytes:
        raise ClientHelloError(f"no ClientHello within {max_bytes} bytes")
    if pos == 0 and data[:1] and data[0] != _RECORD_HANDSHAKE:
        raise ClientHelloError("not a TLS handshake record")
    return None


def _server_name(extensions: bytes) -> str:
    ext = _Cursor(extensions, "extensions")
    while ext.left:
        ext_type = ext.uint(2)
        body = ext.vector(2)
        if ext_type != _EXT_SERVER_NAME:
            continue
        names = _Cursor(body, "server_name extension")
        names = _Cursor(names.vector(2), "server name list")
        while names.left:
            name_type = names.uint(1)
            name = names.vector(2)
            if name_type == _NAME_TYPE_HOST:
                if not name or not name.isascii():
                    raise ClientHelloError("server name is not an ASCII host name")
                return name.decode("ascii")
        break
    raise ClientHelloError("ClientHello carries no server name (SNI)")


def extract_sni(data: bytes, max_bytes: int = MAX_CLIENT_HELLO_BYTES) -> str | None:
    """The SNI host name in ``data``; None if ``data`` is a valid prefix needing more bytes."""
    hello = _handshake_bytes(data, max_bytes)
    if hello is None:
        return None
    cur = _Cursor(hello[4:], "ClientHello")
    cur.take(2 + 32)  # legacy_version, random
    cur.vector(1)  # legacy_session_id
    suites = cur.vector(2)
    if not suites or len(suites) % 2:
        raise ClientHelloError("invalid cipher suite list")
    cur.vector(1)  # legacy_compression_methods
    if not cur.left:
        raise ClientHelloError("ClientHello carries no extensions (no SNI)")
    extensions = cur.vector(2)
    if cur.left:
        raise ClientHelloError("trailing bytes after ClientHello extensions")
    return _server_name(extensions)


def tls_alert(description: int) -> bytes:
    """A fatal TLS alert record (sent before closing when routing fails)."""
    return bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description])


#: TLS alert descriptions used when routing fails.
ALERT_UNRECOGNIZED_NAME = 112
ALERT_HANDSHAKE_FAILURE = 40
ALERT_INTERNAL_ERROR = 80
