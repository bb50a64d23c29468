"""Target resolution (four modes) and the request/response rewriting for the target."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.proxy.errors import ErrorKind, ProxyError
from cloud_gateway.proxy.heads import parse_request_head, parse_response_head
from cloud_gateway.proxy.rewrite import request_head_for_target, response_head_for_client
from cloud_gateway.proxy.target import Mode, Target, resolve_target


def _req(line: str, *headers: str) -> Target:
    head = (line + "\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()
    return resolve_target(parse_request_head(head))


@pytest.mark.parametrize(
    ("line", "headers", "want"),
    [
        (
            "GET /metrics HTTP/1.1",
            ["Host: edge-gpu-7:9400"],
            (Mode.DNS, "edge-gpu-7", 9400, "/metrics"),
        ),
        ("GET /m?x=1 HTTP/1.1", ["Host: Edge-GPU-7."], (Mode.DNS, "edge-gpu-7", 80, "/m?x=1")),
        (
            "GET http://edge-1:9100/metrics HTTP/1.1",
            ["Host: edge-1:9100"],
            (Mode.FORWARD, "edge-1", 9100, "/metrics"),
        ),
        ("GET HTTP://edge-1:9100 HTTP/1.1", [], (Mode.FORWARD, "edge-1", 9100, "/")),
        ("GET http://edge-1?q=1 HTTP/1.1", [], (Mode.FORWARD, "edge-1", 80, "/?q=1")),
        (
            "CONNECT edge-1:10250 HTTP/1.1",
            ["Host: edge-1:10250"],
            (Mode.CONNECT, "edge-1", 10250, ""),
        ),
        (
            "GET /proxy/edge-1:9400/metrics?a=b HTTP/1.1",
            ["Host: gateway:10264"],
            (Mode.PATH, "edge-1", 9400, "/metrics?a=b"),
        ),
        ("GET /proxy/edge-1.site-a:9400 HTTP/1.1", [], (Mode.PATH, "edge-1.site-a", 9400, "/")),
    ],
)
def test_four_modes(line: str, headers: list[str], want: tuple[Mode, str, int, str]) -> None:
    t = _req(line, *headers)
    assert (t.mode, t.node, t.port, t.path) == want


@pytest.mark.parametrize(
    ("line", "headers", "kind"),
    [
        ("GET /metrics HTTP/1.1", ["Host: 10.0.0.1:9400"], ErrorKind.IP_LITERAL),
        ("GET /metrics HTTP/1.1", ["Host: [::1]:9400"], ErrorKind.IP_LITERAL),
        ("GET http://192.168.1.5:9100/ HTTP/1.1", [], ErrorKind.IP_LITERAL),
        ("GET http://[fe80::1]/ HTTP/1.1", [], ErrorKind.IP_LITERAL),
        ("CONNECT 127.0.0.1:10250 HTTP/1.1", [], ErrorKind.IP_LITERAL),
        ("GET /proxy/10.1.2.3:9100/metrics HTTP/1.1", [], ErrorKind.IP_LITERAL),
        ("CONNECT edge-1 HTTP/1.1", [], ErrorKind.BAD_TARGET),  # port required
        ("GET /proxy/edge-1/metrics HTTP/1.1", [], ErrorKind.BAD_TARGET),  # port required
        ("GET https://edge-1/ HTTP/1.1", [], ErrorKind.BAD_TARGET),
        ("GET http://user@edge-1/ HTTP/1.1", [], ErrorKind.BAD_TARGET),
        ("GET / HTTP/1.1", ["Host: edge_1:80"], ErrorKind.BAD_TARGET),
        ("GET / HTTP/1.1", ["Host: edge-1:0"], ErrorKind.BAD_TARGET),
        ("GET / HTTP/1.1", ["Host: edge-1:70000"], ErrorKind.BAD_TARGET),
        ("GET / HTTP/1.1", ["Host: edge-1:9x"], ErrorKind.BAD_TARGET),
        ("OPTIONS * HTTP/1.1", ["Host: a:1"], ErrorKind.BAD_TARGET),
        ("GET / HTTP/1.1", [], ErrorKind.MALFORMED),  # no Host
    ],
)
def test_refused_targets(line: str, headers: list[str], kind: ErrorKind) -> None:
    with pytest.raises(ProxyError) as info:
        _req(line, *headers)
    assert info.value.kind is kind


def test_request_rewritten_to_origin_form_without_hop_by_hop() -> None:
    req = parse_request_head(
        b"GET http://edge-1:9400/metrics HTTP/1.1\r\nHost: edge-1:9400\r\n"
        b"Accept-Encoding: gzip\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
        b"Proxy-Authorization: secret\r\nKeep-Alive: 5\r\n"
        b"X-Prometheus-Scrape-Timeout-Seconds: 3\r\n"
        b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    )
    out = request_head_for_target(req, resolve_target(req))
    assert out.startswith(b"GET /metrics HTTP/1.1\r\nHost: edge-1:9400\r\n")
    assert out.endswith(b"Connection: close\r\n\r\n")
    for gone in (b"X-Hop", b"Proxy-Authorization", b"Keep-Alive", b"keep-alive", b"Expect"):
        assert gone not in out
    for kept in (b"Accept-Encoding: gzip", b"X-Prometheus-Scrape-Timeout-Seconds: 3"):
        assert kept in out
    assert b"Content-Length: 2" in out


def test_connection_header_cannot_strip_body_framing() -> None:
    req = parse_request_head(
        b"POST /x HTTP/1.1\r\nHost: a:1\r\nConnection: content-length\r\nContent-Length: 4\r\n\r\n"
    )
    assert b"Content-Length: 4" in request_head_for_target(req, resolve_target(req))


def test_response_rewrite() -> None:
    resp = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 9\r\n"
        b"Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
        "GET",
    )
    out = response_head_for_client(resp, (1, 1), keep_alive=True, rechunk=False)
    assert out == b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 9\r\n\r\n"
    out = response_head_for_client(resp, (1, 0), keep_alive=False, rechunk=False)
    assert out.endswith(b"Connection: close\r\n\r\n")
    close = parse_response_head(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n", "GET")
    out = response_head_for_client(close, (1, 1), keep_alive=True, rechunk=True)
    assert (
        out == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    both = parse_response_head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "GET"
    )
    assert b"Content-Length" not in response_head_for_client(
        both, (1, 1), keep_alive=True, rechunk=False
    )


@given(
    target=st.text(
        alphabet=st.sampled_from("abcz019-.:/[]@?%*") | st.characters(max_codepoint=0x7E),
        max_size=40,
    ),
    host=st.text(alphabet=st.sampled_from("abc19-.:[]@ "), max_size=20),
)
def test_fuzz_resolver_returns_a_name_target_or_proxy_error(target: str, host: str) -> None:
    line = f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode("ascii", "replace")
    try:
        t = resolve_target(parse_request_head(line))
    except ProxyError:
        return
    assert 0 < t.port < 65536
    assert t.node and ":" not in t.node
    assert t.path.startswith("/")
