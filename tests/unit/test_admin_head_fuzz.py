"""Fuzzing of the admin server's request-head parser (raven/admin/asyncio_backend.py): whatever
a client on the admin port sends, the head is parsed or refused with BadRequest (400 or 413),
which the server answers before it closes the connection. Budgets come from the hypothesis
profile (tests/README.md)."""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from raven.admin.asyncio_backend import BadRequest, parse_head
from raven.admin.routes import AdminRequest

_TOKENS = st.sampled_from(
    [
        "GET", "HEAD", "POST", " ", "/", "//", "?", "&", "=", "%", "%2f", "%ff", "#", "[", "]",
        ":", "@", "a", "metrics", "HTTP/1.1", "HTTP/1.0", "HTTP/2", "\r\n", "\n", "\t",
        "Host", "Connection", "close", "keep-alive", "Content-Length", "0", "7",
        "Transfer-Encoding", "chunked", "Accept-Encoding", "gzip", "\x00", "\xff", "é",
    ]
)  # fmt: skip
_HEADISH = st.lists(_TOKENS, max_size=40).map(lambda parts: "".join(parts) + "\r\n\r\n")
_WELL_FORMED = st.builds(
    lambda method, target, version, headers: (
        f"{method} {target} {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
    ),
    st.sampled_from(["GET", "HEAD", "POST"]),
    st.lists(_TOKENS, max_size=8).map(lambda parts: "/" + "".join(parts).replace(" ", "")),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    st.lists(
        st.tuples(
            st.sampled_from(
                ["Host", "Accept-Encoding", "Connection", "Content-Length", "Transfer-Encoding"]
            ),
            st.sampled_from(["", "0", "7", "gzip", "close", "keep-alive", "chunked", " x "]),
        ),
        max_size=4,
    ),
)


@given(st.one_of(st.binary(max_size=200), _HEADISH.map(str.encode), _WELL_FORMED.map(str.encode)))
def test_any_head_parses_or_is_a_bad_request(head: bytes) -> None:
    try:
        request, keep = parse_head(head, "192.0.2.1")
    except BadRequest as exc:
        assert exc.status in (400, 413)
        event(f"refused {exc.status}")
        return
    event("parsed")
    assert isinstance(request, AdminRequest) and isinstance(keep, bool)
    assert request.method in head.decode("latin-1")
    assert all(name == name.lower() for name in request.headers)


def test_an_invalid_ipv6_authority_is_a_bad_request() -> None:
    with pytest.raises(BadRequest) as info:
        parse_head(b"GET //[x HTTP/1.1\r\n\r\n", "192.0.2.1")
    assert info.value.status == 400


@given(st.binary(max_size=5000))
def test_gzip_compress_is_a_gzip_member(body: bytes) -> None:
    import gzip

    from raven.admin.asyncio_backend import gzip_compress

    packed = gzip_compress(body)
    assert packed[:3] == b"\x1f\x8b\x08" and gzip.decompress(packed) == body
