"""ClientHello SNI extraction (real ClientHellos from the ssl module, no sockets)."""

from __future__ import annotations

import contextlib
import ssl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.proxy.errors import ClientHelloError
from cloud_gateway.proxy.sni import extract_sni, tls_alert


def client_hello(server_name: str | None) -> bytes:
    """The first flight of a real TLS client (OpenSSL via the ssl module)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def _split_into_records(hello: bytes, size: int) -> bytes:
    """Re-frame one handshake record's payload into several records of ``size`` bytes."""
    payload = hello[5:]
    out = bytearray()
    for i in range(0, len(payload), size):
        piece = payload[i : i + size]
        out += b"\x16\x03\x01" + len(piece).to_bytes(2, "big") + piece
    return bytes(out)


def test_real_client_hello() -> None:
    hello = client_hello("edge-gpu-7")
    assert extract_sni(hello) == "edge-gpu-7"


def test_one_byte_at_a_time_needs_more_then_parses() -> None:
    hello = client_hello("edge-gpu-7.site-a")
    for n in range(1, len(hello)):
        assert extract_sni(hello[:n]) is None
    assert extract_sni(hello) == "edge-gpu-7.site-a"


def test_client_hello_split_over_records() -> None:
    hello = _split_into_records(client_hello("kubelet-node"), 50)
    assert extract_sni(hello) == "kubelet-node"
    assert extract_sni(hello[:-1]) is None


def test_no_sni_is_a_clear_error() -> None:
    with pytest.raises(ClientHelloError, match="no server name"):
        extract_sni(client_hello(None))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "not a TLS handshake"),
        (b"G", "not a TLS handshake"),
        (b"\x16\x02\x00\x00\x05hello", "not a TLS record version"),
        (b"\x16\x03\x01\x00\x00", "invalid TLS record length"),
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
        (b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00", "truncated"),
    ],
)
def test_garbage(data: bytes, match: str) -> None:
    with pytest.raises(ClientHelloError, match=match):
        extract_sni(data)


def test_bounded() -> None:
    huge = b"\x16\x03\x01\x40\x00\x01\xff\xff\xff" + bytes(100)
    with pytest.raises(ClientHelloError, match="larger than"):
        extract_sni(huge, max_bytes=4096)


def test_alert_record() -> None:
    assert tls_alert(112) == b"\x15\x03\x03\x00\x02\x02\x70"


@given(data=st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    with contextlib.suppress(ClientHelloError):
        extract_sni(data)


_HELLO = client_hello("edge-1")


@given(pos=st.integers(0, len(_HELLO) - 1), value=st.integers(0, 255), cut=st.integers(1, 600))
def test_fuzz_mutated_client_hello(pos: int, value: int, cut: int) -> None:
    data = bytearray(_HELLO)
    data[pos] = value
    try:
        name = extract_sni(bytes(data[:cut]))
    except ClientHelloError:
        return
    assert name is None or isinstance(name, str)
