"""HTTP/1.1 head parsing for the L7 proxy: requests, responses, the bounded head reader."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.proxy import heads
from cloud_gateway.proxy.errors import ErrorKind, HttpParseError
from cloud_gateway.proxy.heads import (
    BodyKind,
    HeadReader,
    parse_request_head,
    parse_response_head,
)

PROM_GET = (
    b"GET /metrics HTTP/1.1\r\n"
    b"Host: edge-gpu-1:9400\r\n"
    b"User-Agent: Prometheus/2.42.0+ds\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,"
    b"*/*;q=0.1\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
)


def test_prometheus_request_parses() -> None:
    req = parse_request_head(PROM_GET)
    assert req.method == "GET"
    assert req.target == "/metrics"
    assert req.version == (1, 1)
    assert req.host == "edge-gpu-1:9400"
    assert req.body is BodyKind.NONE
    assert req.keep_alive
    assert req.header(b"accept-encoding") == b"gzip"
    assert req.header(b"x-prometheus-scrape-timeout-seconds") == b"10"


def test_connect_and_absolute_form_parse() -> None:
    req = parse_request_head(b"CONNECT edge-1:10250 HTTP/1.1\r\nHost: edge-1:10250\r\n\r\n")
    assert (req.method, req.target) == ("CONNECT", "edge-1:10250")
    req = parse_request_head(
        b"GET http://edge-1:9100/metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
    )
    assert req.target == "http://edge-1:9100/metrics"


@pytest.mark.parametrize(
    ("head", "keep"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True),
    ],
)
def test_keep_alive(head: bytes, keep: bool) -> None:
    assert parse_request_head(head).keep_alive is keep


def test_request_bodies() -> None:
    req = parse_request_head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n")
    assert (req.body, req.content_length) == (BodyKind.LENGTH, 12)
    req = parse_request_head(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert req.body is BodyKind.CHUNKED
    req = parse_request_head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert req.body is BodyKind.NONE
    req = parse_request_head(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n")
    assert req.expect_continue


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",  # duplicate Host
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",  # smuggling
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 4, 4\r\n\r\n",  # equal duplicates too
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",  # obs-fold
        b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",  # whitespace before colon
        b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",  # bare CR
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"G@T / HTTP/1.1\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
        b"GET /\xc3\xa9 HTTP/1.1\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
        b"GET / HTTP/1.1\r\nExpect: something\r\n\r\n",
        b"GET / HTTP/1.1\r\n",  # no blank line
    ],
)
def test_malformed_requests_refused(head: bytes) -> None:
    with pytest.raises(HttpParseError) as info:
        parse_request_head(head)
    assert info.value.kind is ErrorKind.MALFORMED


def test_head_reader_splits_pipelined_requests_and_keeps_body() -> None:
    reader = HeadReader(1024)
    reader.feed(b"\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nbodyGET /b HTTP/1.1\r\n")
    first = reader.next_head()
    assert first is not None and first.startswith(b"GET /a")
    assert reader.take(4) == b"body"
    assert reader.next_head() is None
    reader.feed(b"Host: x\r\n\r\n")
    second = reader.next_head()
    assert second is not None and second.startswith(b"GET /b")
    assert len(reader) == 0


def test_head_reader_bounds_and_bare_lf() -> None:
    reader = HeadReader(64)
    reader.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 100)
    with pytest.raises(HttpParseError) as info:
        reader.next_head()
    assert info.value.kind is ErrorKind.HEADER_TOO_LARGE
    reader = HeadReader(64)
    reader.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 50 + b"\r\n\r\n")
    with pytest.raises(HttpParseError):
        reader.next_head()
    reader = HeadReader(1024)
    reader.feed(b"GET / HTTP/1.1\nHost: a\n\n")
    with pytest.raises(HttpParseError) as info:
        reader.next_head()
    assert info.value.kind is ErrorKind.MALFORMED


def test_head_reader_one_byte_at_a_time() -> None:
    data = PROM_GET + b"GET /x HTTP/1.1\r\nHost: a:1\r\n\r\n"
    reader = HeadReader(16384)
    heads = []
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
        head = reader.next_head()
        if head is not None:
            heads.append(parse_request_head(head))
    assert [h.target for h in heads] == ["/metrics", "/x"]


def test_head_reader_unread_puts_bytes_in_front() -> None:
    reader = HeadReader(1024)
    reader.feed(b"Host: a\r\n\r\n")
    reader.unread(b"GET / HTTP/1.1\r\n")
    head = reader.next_head()
    assert head is not None and parse_request_head(head).host == "a"


@pytest.mark.parametrize(
    ("head", "method", "body", "length"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "GET", BodyKind.LENGTH, 10),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", BodyKind.CHUNKED, 0),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "GET",
            BodyKind.CHUNKED,
            0,
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", BodyKind.CLOSE, 0),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
            "GET",
            BodyKind.CHUNKED,
            0,
        ),
        (b"HTTP/1.0 200 OK\r\n\r\n", "GET", BodyKind.CLOSE, 0),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "HEAD", BodyKind.NONE, 0),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "GET", BodyKind.NONE, 0),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", "GET", BodyKind.NONE, 0),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "POST", BodyKind.NONE, 0),
        (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", "GET", BodyKind.NONE, 0),
    ],
)
def test_response_framing(head: bytes, method: str, body: BodyKind, length: int) -> None:
    resp = parse_response_head(head, method)
    assert (resp.body, resp.content_length) == (body, length)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
    ],
)
def test_bad_responses(head: bytes) -> None:
    with pytest.raises(HttpParseError) as info:
        parse_response_head(head, "GET")
    assert info.value.kind is ErrorKind.BAD_RESPONSE


def _drive_reader(data: bytes, step: int) -> None:
    reader = HeadReader(512)
    for i in range(0, len(data), step):
        reader.feed(data[i : i + step])
        head = reader.next_head()
        while head is not None:
            parse_request_head(head)
            head = reader.next_head()


_HEADISH = st.lists(
    st.sampled_from(
        [
            b"GET ",
            b"/",
            b"x",
            b" HTTP/1.1",
            b"\r\n",
            b"Host: ",
            b"a:1",
            b":",
            b"\n",
            b"\r",
            b"Content-Length: 5",
            b"Transfer-Encoding: chunked",
            b" ",
            b"\x00",
            b"\xff",
        ]
    ),
    max_size=60,
).map(b"".join)


@given(data=st.one_of(st.binary(max_size=600), _HEADISH), step=st.integers(1, 64))
def test_fuzz_request_side_parses_or_raises_its_own_error(data: bytes, step: int) -> None:
    with contextlib.suppress(HttpParseError):
        _drive_reader(data, step)


@given(data=st.one_of(st.binary(max_size=400), _HEADISH))
def test_fuzz_response_parser(data: bytes) -> None:
    try:
        parse_response_head(data, "GET")
    except HttpParseError as exc:
        assert exc.kind is ErrorKind.BAD_RESPONSE


_HEADER_BYTES = st.sampled_from(
    [b"a", b"Host", b"-", b":", b" ", b"\t", b"\r", b"\n", b"\r\n", b"\x00", b"\x7f", b"\xff", b"v"]
)


@given(st.lists(_HEADER_BYTES, max_size=24).map(b"".join))
def test_the_one_match_header_path_agrees_with_the_line_checks(block: bytes) -> None:
    """_split_headers accepts exactly what the per-line checks accept, with the same pairs,
    and refuses the rest with the per-line checks' error."""
    expected: list[tuple[bytes, bytes]] | str
    try:
        expected = heads._split_header_lines(block.split(b"\r\n"), ErrorKind.MALFORMED)
    except HttpParseError as exc:
        expected = str(exc)
    if not block:
        expected = []  # a head without header lines
    try:
        got: list[tuple[bytes, bytes]] | str = heads._split_headers(block, ErrorKind.MALFORMED)
    except HttpParseError as exc:
        got = str(exc)
    assert got == expected
