"""The one host:port parser (listen addresses, gateway addresses, DNS servers)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.hostport import AddressError, parse_hostport


@pytest.mark.parametrize(
    ("text", "default_port", "expected"),
    [
        ("127.0.0.1:10262", None, ("127.0.0.1", 10262)),
        ("gateway.raven.svc:10262", None, ("gateway.raven.svc", 10262)),
        (":9400", None, ("0.0.0.0", 9400)),
        ("[::1]:9401", None, ("::1", 9401)),
        ("[::]:0", None, ("::", 0)),
        (" 10.0.0.1:53 ", None, ("10.0.0.1", 53)),
        ("10.96.0.10", 53, ("10.96.0.10", 53)),
        ("fd00::10", 53, ("fd00::10", 53)),
        ("[fd00::10]", 53, ("fd00::10", 53)),
    ],
)
def test_parses(text: str, default_port: int | None, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, default_port) == expected


def test_default_host_is_the_callers() -> None:
    assert parse_hostport(":9400", default_host="") == ("", 9400)


@pytest.mark.parametrize(
    "bad",
    ["", "  ", "host", "9400", "h:x", "h:70000", "h:-1", "[::1", "[::1]x", "[::1]:", "fd00::1"],
)
def test_refuses_with_the_text_quoted(bad: str) -> None:
    with pytest.raises(AddressError) as info:
        parse_hostport(bad)
    assert isinstance(info.value, ValueError)
    assert bad.strip() == "" or repr(bad) in str(info.value)


@given(st.text(alphabet=st.sampled_from("ab.:[]019 x-"), max_size=30), st.sampled_from([None, 53]))
def test_any_text_parses_or_raises_address_error(text: str, default_port: int | None) -> None:
    try:
        host, port = parse_hostport(text, default_port)
    except AddressError:
        return
    assert 0 <= port < 65536 and host
