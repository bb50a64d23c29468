"""The HTTP exchanges before a tunnel (CONNECT through a proxy, the WebSocket upgrade):
requests written right, answers read within bounds, garbage refused (fuzzed)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol import tunnel_http as th

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
UPGRADE = (
    b"GET /raven/tunnel HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
    b"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: " + KEY.encode() + b"\r\nSec-WebSocket-Protocol: raven.tunnel.v1\r\n\r\n"
)


def test_connect_request_with_basic_credentials() -> None:
    req = th.connect_request("gw.example.com", 443, "site:p@ss")
    assert req.startswith(b"CONNECT gw.example.com:443 HTTP/1.1\r\nHost: gw.example.com:443\r\n")
    token = base64.b64encode(b"site:p@ss").decode()
    assert f"Proxy-Authorization: Basic {token}\r\n".encode() in req
    assert req.endswith(b"\r\n\r\n")
    assert th.connect_request("fd00::1", 10262).startswith(b"CONNECT [fd00::1]:10262 ")


def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError):
        th.connect_request("gw\r\nX-Evil: 1", 443)
    with pytest.raises(ValueError):
        th.upgrade_request("gw", "/p\r\n", KEY, subprotocol="s", extra_headers={})


def test_response_head_in_pieces_keeps_what_follows() -> None:
    head = th.ResponseHead()
    assert not head.feed(b"HTTP/1.1 200 Connection")
    assert head.feed(b" established\r\nVia: squid\r\n\r\nNOISE")
    assert (head.status, head.headers["via"], head.rest) == (200, "squid", b"NOISE")
    assert head.what() == "200 Connection established"


def test_websocket_accept_is_rfc_6455s_example() -> None:
    assert th.websocket_accept(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_upgrade_request_is_accepted_and_answered() -> None:
    req = th.RequestHead()
    assert req.feed(UPGRADE + b"\x82")
    assert req.upgrade_error("/raven/tunnel", "raven.tunnel.v1") is None
    assert req.rest == b"\x82"
    answer = th.ResponseHead()
    assert answer.feed(th.upgrade_response(KEY, "raven.tunnel.v1"))
    assert answer.status == 101
    assert answer.headers["sec-websocket-accept"] == th.websocket_accept(KEY)


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ((b"/raven/tunnel", b"/other"), 404),
        ((b"Upgrade: websocket", b"Upgrade: h2c"), 426),
        ((b"Version: 13", b"Version: 8"), 426),
        ((KEY.encode(), b"short"), 400),
        ((b"raven.tunnel.v1", b"chat"), 400),
    ],
)
def test_upgrade_errors(change: tuple[bytes, bytes], status: int) -> None:
    req = th.RequestHead()
    assert req.feed(UPGRADE.replace(*change))
    error = req.upgrade_error("/raven/tunnel", "raven.tunnel.v1")
    assert error is not None and error[0] == status


def test_oversized_and_non_http_answers() -> None:
    with pytest.raises(th.HttpHeadError, match="over"):
        th.ResponseHead().feed(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 4000)
    with pytest.raises(th.HttpHeadError, match="not HTTP"):
        th.ResponseHead().feed(b"\x16\x03\x01\x02\x00")
    with pytest.raises(th.HttpHeadError):
        th.ResponseHead().feed(b"HTTP/1.1 abc\r\n\r\n")
    with pytest.raises(th.HttpHeadError):
        th.RequestHead().feed(b"GET / HTTP/1.0\r\n\r\n")


@given(st.lists(st.binary(max_size=200), max_size=8))
def test_any_bytes_give_a_head_or_http_head_error(chunks: list[bytes]) -> None:
    for reader in (th.ResponseHead(), th.RequestHead()):
        try:
            for chunk in chunks:
                reader.feed(chunk)
        except th.HttpHeadError:
            continue
        assert len(reader.buf) <= th.MAX_HEAD_BYTES + 200
