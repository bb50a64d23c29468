"""Body framing: the proxy must know exactly where a body ends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.proxy.errors import ErrorKind, HttpParseError
from cloud_gateway.proxy.framing import (
    LAST_CHUNK,
    BodyFramer,
    ChunkedFramer,
    CloseFramer,
    LengthFramer,
    chunk,
    framer_for,
)
from cloud_gateway.proxy.heads import BodyKind


def _feed_all(framer: BodyFramer, data: bytes, step: int) -> int:
    """Bytes consumed feeding ``data`` in ``step``-sized pieces until the body is done."""
    used = 0
    for i in range(0, len(data), step):
        piece = data[i : i + step]
        n = framer.feed(piece)
        used += n
        if framer.done:
            break
        assert n == len(piece)
    return used


def _chunked(parts: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"".join(chunk(p)) for p in parts if p) + b"0\r\n" + trailers + b"\r\n"


def test_length_framer() -> None:
    framer = LengthFramer(5)
    assert framer.feed(b"abc") == 3 and not framer.done
    assert framer.feed(b"deXYZ") == 2 and framer.done
    assert not LengthFramer(3).finish()
    assert LengthFramer(0).done


def test_close_framer_takes_everything_until_eof() -> None:
    framer = CloseFramer()
    assert framer.feed(b"x" * 100) == 100 and not framer.done
    assert framer.finish() and framer.done


def test_chunked_body_with_extensions_and_trailers() -> None:
    body = b"5;ext=1\r\nhello\r\nA \r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n"
    framer = ChunkedFramer()
    assert framer.feed(body + b"NEXT") == len(body)
    assert framer.done


@given(
    parts=st.lists(st.binary(min_size=0, max_size=300), max_size=8),
    step=st.integers(1, 97),
    trailing=st.binary(max_size=20),
)
def test_chunked_any_split_finds_the_exact_end(
    parts: list[bytes], step: int, trailing: bytes
) -> None:
    body = _chunked(parts)
    framer = ChunkedFramer()
    assert _feed_all(framer, body + trailing, step) == len(body)
    assert framer.done


def test_chunked_one_byte_at_a_time() -> None:
    body = _chunked([b"a" * 17, b"b" * 300], b"T: v\r\n")
    framer = ChunkedFramer()
    assert _feed_all(framer, body, 1) == len(body)


def test_chunked_cut_short_is_not_complete() -> None:
    body = _chunked([b"a" * 100])
    framer = ChunkedFramer()
    framer.feed(body[:-1])
    assert not framer.done
    assert not framer.finish()


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\n",
        b"5\r\nhelloXX",
        b"5\nhello\r\n",
        b"-1\r\n",
        b"1234567890123456\r\n",  # size beyond 15 hex digits
        b"0\r\nno-colon-trailer\r\n\r\n",
        b"5\r\r\n",
    ],
)
def test_chunked_garbage_raises_given_kind(body: bytes) -> None:
    framer = ChunkedFramer(ErrorKind.BAD_RESPONSE)
    with pytest.raises(HttpParseError) as info:
        _feed_all(framer, body, 3)
    assert info.value.kind is ErrorKind.BAD_RESPONSE


def test_chunk_line_is_bounded() -> None:
    framer = ChunkedFramer()
    with pytest.raises(HttpParseError):
        for _ in range(100):
            framer.feed(b"1;" + b"e" * 100)


def test_framer_for_and_last_chunk() -> None:
    assert isinstance(framer_for(BodyKind.LENGTH, 3, ErrorKind.MALFORMED), LengthFramer)
    assert isinstance(framer_for(BodyKind.CHUNKED, 0, ErrorKind.MALFORMED), ChunkedFramer)
    assert isinstance(framer_for(BodyKind.CLOSE, 0, ErrorKind.MALFORMED), CloseFramer)
    none = framer_for(BodyKind.NONE, 0, ErrorKind.MALFORMED)
    assert none.done and none.feed(b"abc") == 0
    rechunked = b"".join(chunk(b"hello")) + LAST_CHUNK
    framer = ChunkedFramer()
    assert framer.feed(rechunked) == len(rechunked) and framer.done


@given(data=st.binary(max_size=500), step=st.integers(1, 50))
def test_fuzz_chunked_only_raises_its_own_error(data: bytes, step: int) -> None:
    framer = ChunkedFramer()
    try:
        used = _feed_all(framer, data, step)
    except HttpParseError as exc:
        assert exc.kind is ErrorKind.MALFORMED
    else:
        assert 0 <= used <= len(data)
