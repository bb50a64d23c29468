"""Types shared by the hosts generator: entries, snapshots, errors and name validation.

Pure: no I/O. A *snapshot* is what a source believes should resolve right now; the
renderer (``render.py``) turns it into hosts-file text and the sinks write that text.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Longest DNS name in presentation form, without the trailing dot (RFC 1035 2.3.4).
MAX_NAME_LENGTH = 253
#: One label: letters, digits and inner hyphens, 1 to 63 characters (RFC 1123 2.1).
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")


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


def normalize_name(name: str) -> str | None:
    """Return the canonical (lower-case) form of a host name, or None when it is invalid.

    Valid: 1 to 253 characters, dot-separated RFC 1123 labels of 1 to 63 letters, digits and
    inner hyphens, the last label not all digits (so a name can never look like an IPv4
    address). No trailing dot, no wildcard, no underscore.
    """
    if not name or len(name) > MAX_NAME_LENGTH or not name.isascii():
        return None
    lowered = name.lower()
    if _NAME.fullmatch(lowered) is None or lowered.rpartition(".")[2].isdigit():
        return None
    return lowered


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
