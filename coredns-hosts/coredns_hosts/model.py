"""Types shared by the hosts generator: entries, snapshots, errors, addresses. Names follow
the one node-name rule of `raven.protocol.names`.

Pure: no I/O. A *snapshot* is what a source believes should resolve right now; the
renderer (``render.py``) turns it into hosts-file text and the sinks write that text.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class HostsError(Exception):
    """Base class of every error the hosts generator raises on purpose."""


class InputError(HostsError):
    """An input document (static YAML, registry JSON, hosts file, Kubernetes object) is invalid."""


class SourceNotReady(HostsError):
    """A source cannot produce a snapshot yet (initial list pending, no gateway address)."""


class SinkError(HostsError):
    """A sink could not store the rendered text; the previous content is left in place."""


class Entry(NamedTuple):
    """One name and the addresses it resolves to (any mix of IPv4 and IPv6)."""

    name: str
    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What should resolve, as seen by one source at one moment.

    ``origin`` names the source in the generated header (e.g. ``kubernetes nodes
    openyurt.io/is-edge-worker=true``); it must be stable, as it is part of the output.
    """

    entries: tuple[Entry, ...]
    origin: str

    @classmethod
    def uniform(cls, names: Iterable[str], addresses: Iterable[IPAddress], origin: str) -> Snapshot:
        """Every name resolves to the same addresses (the gateway Service's)."""
        addrs = tuple(addresses)
        return cls(tuple(Entry(n, addrs) for n in names), origin)


def parse_address(text: object) -> IPAddress:
    """Parse one IPv4 or IPv6 address (no prefix length, no zone); InputError otherwise."""
    if not isinstance(text, str):
        raise InputError(f"address must be a string, got {type(text).__name__}")
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        raise InputError(f"not an IP address: {text[:80]!r}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        raise InputError(f"IPv6 zone not allowed in a hosts file: {text[:80]!r}")
    return address


def address_sort_key(address: IPAddress) -> tuple[int, int]:
    """IPv4 before IPv6, then numeric order."""
    return (address.version, int(address))
