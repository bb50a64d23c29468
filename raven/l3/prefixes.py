"""Longest-prefix match over IPv4 and IPv6 prefixes.

One dict per prefix length and family; a lookup masks the address once per
distinct prefix length present, longest first. Tables hold tens of prefixes,
so this beats a trie in Python and stays obviously correct.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Generic, TypeVar

from raven.l3.packet import IPV4

T = TypeVar("T")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_BITS = {4: 32, 6: 128}


def _mask(version: int, prefix_len: int) -> int:
    bits = _BITS[version]
    return ((1 << prefix_len) - 1) << (bits - prefix_len)


class _Family(Generic[T]):
    __slots__ = ("by_len", "lengths", "masks", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.by_len: dict[int, dict[int, T]] = {}
        #: (prefix length, mask, that length's dict), longest first.
        self.lengths: list[tuple[int, int, dict[int, T]]] = []

    def rebuild(self) -> None:
        self.lengths = [
            (n, _mask(self.version, n), self.by_len[n]) for n in sorted(self.by_len, reverse=True)
        ]


class PrefixTable(Generic[T]):
    """A map from IP prefixes to values with longest-prefix-match lookup."""

    def __init__(self) -> None:
        self._families: dict[int, _Family[T]] = {4: _Family(4), 6: _Family(6)}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, network: object) -> bool:
        if not isinstance(network, ipaddress.IPv4Network | ipaddress.IPv6Network):
            return False
        return self.get(network) is not None

    def set(self, network: IPNetwork, value: T) -> None:
        """Map ``network`` (host bits must be zero) to ``value``, replacing any old value."""
        fam = self._families[network.version]
        plen = network.prefixlen
        table = fam.by_len.get(plen)
        if table is None:
            table = fam.by_len[plen] = {}
            fam.rebuild()
        key = int(network.network_address)
        if key not in table:
            self._count += 1
        table[key] = value

    def get(self, network: IPNetwork) -> T | None:
        """The value of exactly ``network``, or None."""
        table = self._families[network.version].by_len.get(network.prefixlen)
        return None if table is None else table.get(int(network.network_address))

    def remove(self, network: IPNetwork) -> T | None:
        """Remove exactly ``network``; returns its value (None if absent)."""
        fam = self._families[network.version]
        table = fam.by_len.get(network.prefixlen)
        if table is None:
            return None
        value = table.pop(int(network.network_address), None)
        if value is not None:
            self._count -= 1
            if not table:
                del fam.by_len[network.prefixlen]
                fam.rebuild()
        return value

    def lookup(self, version: int, address: int) -> T | None:
        """The value of the longest prefix containing ``address`` (an int), or None."""
        for _, mask, table in self._families[version].lengths:
            value = table.get(address & mask)
            if value is not None:
                return value
        return None

    def covers(self, network: IPNetwork) -> bool:
        """True when all of ``network`` lies inside one prefix of this table."""
        key = int(network.network_address)
        for plen, mask, table in self._families[network.version].lengths:
            if plen <= network.prefixlen and (key & mask) in table:
                return True
        return False

    def lookup_address(self, address: IPAddress) -> T | None:
        return self.lookup(address.version, int(address))

    def items(self) -> Iterator[tuple[IPNetwork, T]]:
        """All (prefix, value) pairs, IPv4 first, longest prefixes first."""
        for version in (IPV4, 6):
            for plen, _, table in self._families[version].lengths:
                for key, value in table.items():
                    net: IPNetwork
                    if version == IPV4:
                        net = ipaddress.IPv4Network((key, plen))
                    else:
                        net = ipaddress.IPv6Network((key, plen))
                    yield net, value
