"""Longest-prefix match against a brute-force oracle, for IPv4 and IPv6."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from raven.l3 import IPNetwork, PrefixTable


def net(text: str) -> IPNetwork:
    return ipaddress.ip_network(text)


def brute_force(prefixes: dict[IPNetwork, int], version: int, address: int) -> int | None:
    best: tuple[int, int] | None = None
    addr = ipaddress.ip_address(address) if version == 4 else ipaddress.IPv6Address(address)
    for prefix, value in prefixes.items():
        if (
            prefix.version == version
            and addr in prefix
            and (best is None or prefix.prefixlen > best[0])
        ):
            best = (prefix.prefixlen, value)
    return None if best is None else best[1]


def test_basic_lpm_and_removal() -> None:
    table: PrefixTable[str] = PrefixTable()
    table.set(net("10.0.0.0/8"), "wide")
    table.set(net("10.20.0.0/16"), "site")
    table.set(net("0.0.0.0/0"), "default")
    table.set(net("fd00::/8"), "v6")
    assert table.lookup_address(ipaddress.ip_address("10.20.3.4")) == "site"
    assert table.lookup_address(ipaddress.ip_address("10.21.3.4")) == "wide"
    assert table.lookup_address(ipaddress.ip_address("8.8.8.8")) == "default"
    assert table.lookup_address(ipaddress.ip_address("fd12::1")) == "v6"
    assert table.lookup_address(ipaddress.ip_address("2001:db8::1")) is None
    assert len(table) == 4 and net("10.20.0.0/16") in table
    assert table.remove(net("10.20.0.0/16")) == "site"
    assert table.remove(net("10.20.0.0/16")) is None
    assert table.lookup_address(ipaddress.ip_address("10.20.3.4")) == "wide"
    assert len(table) == 3
    assert sorted(str(p) for p, _ in table.items()) == ["0.0.0.0/0", "10.0.0.0/8", "fd00::/8"]


def test_covers() -> None:
    table: PrefixTable[bool] = PrefixTable()
    table.set(net("10.20.0.0/16"), True)
    assert table.covers(net("10.20.5.0/24"))
    assert table.covers(net("10.20.0.0/16"))
    assert not table.covers(net("10.0.0.0/8"))
    assert not table.covers(net("10.21.0.0/24"))
    assert not table.covers(net("fd00::/64"))


# Addresses drawn from a small space so prefixes overlap often.
v4_prefix = st.builds(
    lambda a, n: ipaddress.IPv4Network((a, n), strict=False),
    st.integers(0, 2**32 - 1).map(lambda x: x & 0xFF0F0000),
    st.integers(0, 32),
)
v6_prefix = st.builds(
    lambda a, n: ipaddress.IPv6Network((a, n), strict=False),
    st.integers(0, 255).map(lambda x: (0xFD << 120) | (x << 100)),
    st.integers(0, 128),
)


@given(
    st.lists(st.one_of(v4_prefix, v6_prefix), max_size=25),
    st.lists(st.integers(0, 24), max_size=8),
    st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20),
    st.lists(st.integers(0, 255), min_size=1, max_size=10),
)
def test_lpm_matches_brute_force(
    prefixes: list[IPNetwork], removals: list[int], v4_addrs: list[int], v6_bits: list[int]
) -> None:
    table: PrefixTable[int] = PrefixTable()
    model: dict[IPNetwork, int] = {}
    for i, prefix in enumerate(prefixes):
        table.set(prefix, i)
        model[prefix] = i
    for r in removals:
        if prefixes:
            victim = prefixes[r % len(prefixes)]
            assert table.remove(victim) == model.pop(victim, None)
    assert len(table) == len(model)
    for raw in v4_addrs:
        a = raw & 0xFF0FFFFF
        assert table.lookup(4, a) == brute_force(model, 4, a)
    for b in v6_bits:
        a6 = (0xFD << 120) | (b << 100) | 1
        assert table.lookup(6, a6) == brute_force(model, 6, a6)
