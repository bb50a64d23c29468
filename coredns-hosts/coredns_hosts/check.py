"""``check``: ask a DNS server for every expected name (A and AAAA) and list the mismatches."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from coredns_hosts.model import InputError, IPAddress
from raven.hostport import parse_hostport

DNS_PORT = 53


@dataclass(frozen=True, slots=True)
class Mismatch:
    name: str
    rdtype: str
    expected: frozenset[IPAddress]
    got: frozenset[IPAddress]
    detail: str

    def describe(self) -> str:
        def fmt(addrs: frozenset[IPAddress]) -> str:
            return ",".join(sorted(map(str, addrs))) or "-"

        return (
            f"MISMATCH {self.name} {self.rdtype}: expected {fmt(self.expected)} "
            f"got {fmt(self.got)}{f' ({self.detail})' if self.detail else ''}"
        )


def parse_server(text: str) -> tuple[str, int]:
    """``IP``, ``IP:port``, ``[IPv6]:port`` or bare IPv6 -> (ip, port); InputError otherwise."""
    usage = f"bad server {text!r}: use IP, IP:PORT or [IPv6]:PORT"
    try:
        host, port = parse_hostport(text, default_port=DNS_PORT)
        ipaddress.ip_address(host)
    except ValueError:
        raise InputError(usage) from None
    if port == 0:
        raise InputError(f"bad server port in {text!r}")
    return host, port


async def _query(
    resolver: dns.asyncresolver.Resolver, name: str, rdtype: str
) -> tuple[frozenset[IPAddress], str]:
    try:
        answer = await resolver.resolve(
            dns.name.from_text(name), rdtype, search=False, raise_on_no_answer=False
        )
    except dns.resolver.NXDOMAIN:
        return frozenset(), "NXDOMAIN"
    except dns.resolver.NoNameservers:
        return frozenset(), "server failure or refused"
    except dns.exception.Timeout:
        return frozenset(), "timeout"
    except dns.exception.DNSException as exc:
        return frozenset(), f"{type(exc).__name__}: {exc}"
    if answer.rrset is None:
        return frozenset(), ""
    return frozenset(ipaddress.ip_address(r.address) for r in answer.rrset), ""


async def check_names(
    expected: Mapping[str, frozenset[IPAddress]],
    server: str,
    port: int = DNS_PORT,
    *,
    timeout_s: float = 2.0,
    concurrency: int = 32,
) -> list[Mismatch]:
    """Query every name for A and AAAA; return the mismatches sorted by name and type."""
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [server]
    resolver.port = port
    resolver.timeout = timeout_s
    resolver.lifetime = timeout_s * 2
    resolver.cache = None
    gate = asyncio.Semaphore(concurrency)
    mismatches: list[Mismatch] = []

    async def one(name: str, rdtype: str, version: int) -> None:
        want = frozenset(a for a in expected[name] if a.version == version)
        async with gate:
            got, detail = await _query(resolver, name, rdtype)
        if got != want or detail in ("timeout", "server failure or refused"):
            mismatches.append(Mismatch(name, rdtype, want, got, detail))

    await asyncio.gather(*(one(n, t, v) for n in expected for t, v in (("A", 4), ("AAAA", 6))))
    return sorted(mismatches, key=lambda m: (m.name, m.rdtype))
