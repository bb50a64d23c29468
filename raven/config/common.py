"""Config pieces shared by the gateway and the agent."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from raven.config.loader import ConfigError, doc
from raven.hostport import AddressError, parse_hostport
from raven.protocol.frames import MAX_OPEN_DATA_BYTES
from raven.protocol.limits import Limits

_DEFAULTS = Limits()

__all__ = ["check_hostport", "parse_hostport", "parse_prefix"]


def check_hostport(field: str, value: str, default_port: int | None = None) -> tuple[str, int]:
    """:func:`parse_hostport` for config field ``field``: the error names the field and shows
    the expected form."""
    try:
        return parse_hostport(value, default_port)
    except AddressError as exc:
        raise ConfigError(f"{field}: {exc}; write host:port, e.g. 0.0.0.0:10262") from None


def parse_prefix(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An IP prefix such as ``10.20.0.0/16``; host bits must be zero."""
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ConfigError(f"{value!r}: not an IP prefix: {exc}") from None


@dataclass(frozen=True)
class LimitsConfig:
    """Tunnel limits (see docs/protocol.md, "Limits"). Both sides enforce what they receive."""

    stream_window_bytes: int = doc(
        "Initial flow-control credit per stream and direction (at least 16384: the most "
        "data an OPEN may carry).",
        default=_DEFAULTS.stream_window_bytes,
    )
    max_streams: int = doc(
        "Open streams per tunnel; beyond it opens are refused (busy).",
        default=_DEFAULTS.max_streams,
    )
    max_tunnel_buffered_bytes: int = doc(
        "Receive windows summed over a tunnel's streams (the most a peer can make us buffer, "
        "both directions' streams); new streams get smaller windows near it, then are refused. "
        "Busy streams' windows move toward an equal share of it as they return credit.",
        default=_DEFAULTS.max_tunnel_buffered_bytes,
    )
    max_queued_datagrams: int = doc(
        "L3 packets queued for the tunnel; beyond it packets are dropped and counted.",
        default=_DEFAULTS.max_queued_datagrams,
    )
    max_queued_datagram_bytes: int = doc(
        "Bytes of L3 packets queued for the tunnel; beyond it packets are dropped and counted.",
        default=_DEFAULTS.max_queued_datagram_bytes,
    )
    keepalive_interval_s: float = doc(
        "Idle time after which a ping is sent.", default=_DEFAULTS.keepalive_interval_s
    )
    dead_peer_timeout_s: float = doc(
        "Silence after which the peer is declared dead and the tunnel closed.",
        default=_DEFAULTS.dead_peer_timeout_s,
    )
    handshake_timeout_s: float = doc(
        "Time allowed for the handshake.", default=_DEFAULTS.handshake_timeout_s
    )
    rekey_after_s: float = doc(
        "The sending key is rotated after this many seconds.", default=_DEFAULTS.rekey_after_s
    )
    rekey_after_records: int = doc(
        "... or after this many records, whichever comes first.",
        default=_DEFAULTS.rekey_after_records,
    )
    drain_timeout_s: float = doc(
        "On shutdown, open streams get this long to finish.", default=_DEFAULTS.drain_timeout_s
    )
    rehandshake_after_s: float = doc(
        "The agent runs a new handshake (fresh Diffie-Hellman keys) inside the tunnel this "
        "often; streams are not disturbed.",
        default=_DEFAULTS.rehandshake_after_s,
    )
    max_registration_entries: int = doc(
        "Node names and prefixes one registration may carry; beyond it the tunnel is closed.",
        default=_DEFAULTS.max_registration_entries,
    )
    max_control_frames_per_s: float = doc(
        "Control work the peer may cause per second: each frame other than data, datagram and "
        "credit, and each registration entry, counts one; beyond it the tunnel is closed.",
        default=_DEFAULTS.max_control_frames_per_s,
    )
    max_control_bytes_per_s: float = doc(
        "Bytes of those control frames the peer may send per second; beyond it the tunnel "
        "is closed.",
        default=_DEFAULTS.max_control_bytes_per_s,
    )
    control_burst_s: float = doc(
        "Both control budgets hold this many seconds' worth (the burst a peer may spend at once).",
        default=_DEFAULTS.control_burst_s,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"limits.{f.name} must be positive")
        if self.dead_peer_timeout_s <= self.keepalive_interval_s:
            raise ValueError("limits.dead_peer_timeout_s must be larger than keepalive_interval_s")
        if self.stream_window_bytes < MAX_OPEN_DATA_BYTES:  # an OPEN's data fits any window
            raise ValueError(f"limits.stream_window_bytes must be at least {MAX_OPEN_DATA_BYTES}")

    def to_limits(self) -> Limits:
        return dataclasses.replace(Limits(), **dataclasses.asdict(self))


@dataclass(frozen=True)
class TunConfig:
    """The L3 TUN device (needs CAP_NET_ADMIN and /dev/net/tun)."""

    enabled: bool = doc(
        "Carry IP packets between this side's TUN device and the tunnel.", default=False
    )
    name: str = doc("Interface name.", default="raven0")
    mtu: int = doc("Interface MTU: leave room for tunnel overhead (see docs/l3.md).", default=1380)
    addresses: list[str] = doc(
        "Addresses with prefix length set on the interface, e.g. 10.99.0.1/24.",
        default_factory=list,
    )
    routes: list[str] = doc(
        "Prefixes routed into the interface (the gateway adds agents' prefixes itself).",
        default_factory=list,
    )

    def __post_init__(self) -> None:
        if not 576 <= self.mtu <= 65535:
            raise ValueError("tun.mtu must be between 576 and 65535")
        if not self.name or len(self.name) > 15 or "/" in self.name:
            raise ValueError("tun.name must be 1-15 characters without '/'")
        for a in self.addresses:
            try:
                ipaddress.ip_interface(a)
            except ValueError:
                raise ValueError(f"tun.addresses: {a!r} is not an address/prefix") from None
        for r in self.routes:
            parse_prefix(r)


@dataclass(frozen=True)
class LogConfig:
    level: str = doc("Log level: debug, info, warning, error.", default="info")
    format: str = doc(
        "'console' (readable), 'text' (key=value lines), 'json' (one object per line) or "
        "'auto' (console on a terminal, text otherwise). The --log-format flag overrides it.",
        default="auto",
    )

    def __post_init__(self) -> None:
        if self.level.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError(f"log.level {self.level!r} is not one of debug, info, warning, error")
        if self.format not in {"auto", "console", "text", "json"}:
            raise ValueError(f"log.format {self.format!r} is not one of auto, console, text, json")
