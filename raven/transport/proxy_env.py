"""Which HTTP forward proxy (if any) the agent's tunnel goes through, by the conventions
curl and Go use.

The agent's own setting (``proxy.url``, ``proxy.no_proxy``) takes precedence; else the
environment: ``https_proxy`` / ``HTTPS_PROXY`` (the tunnel is TLS or opaque bytes, so the
HTTPS variable is the one that applies, as for Go's ``ProxyFromEnvironment``) and
``no_proxy`` / ``NO_PROXY``. ``NO_PROXY`` entries, comma-separated (Go's rules):

- ``*`` alone: no proxy for any host;
- ``example.com``: that name and every name under it; ``.example.com``: names under it only;
- an IP address: that address; a CIDR (``10.0.0.0/8``): every address in it;
- any entry may end in ``:port``: then only that port matches.

Loopback (``localhost``, 127.0.0.0/8, ::1) never goes through the environment's proxy, as in
Go; a proxy set in the agent's own config applies to every destination not in ``no_proxy``.
Pure: nothing here opens a connection.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ProxyRoute", "bypasses", "parse_proxy_url", "proxy_for"]

#: ``proxy.url`` value that turns the environment's proxy off for the agent.
DIRECT = "direct"


@dataclass(frozen=True)
class ProxyRoute:
    """An HTTP forward proxy to reach the gateway through (``CONNECT``)."""

    scheme: str  # "http" or "https" (TLS to the proxy itself)
    host: str
    port: int
    #: ``user:password`` for Basic proxy authentication; never in logs (repr hides it)
    credentials: str | None = field(default=None, repr=False)
    #: CA file to verify an https:// proxy's certificate (None: the system's CAs)
    ca_file: str | None = None

    @property
    def label(self) -> str:
        """``http://proxy.example:3128`` (no credentials): for logs, metrics and status."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_proxy_url(url: str, *, ca_file: str | None = None) -> ProxyRoute:
    """``http://[user:pass@]host[:port]`` or ``https://...`` (a bare ``host:port`` is
    http://, as curl reads it). ValueError naming what is wrong (never the password)."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"proxy URL scheme {scheme!r}: use http:// or https://")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("proxy URL has a bad port") from None
    if not parts.hostname:
        raise ValueError("proxy URL has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("proxy URL must be scheme://[user:password@]host[:port]")
    credentials = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        credentials = f"{user}:{password}"
    return ProxyRoute(
        scheme=scheme,
        host=parts.hostname,
        port=port or (443 if scheme == "https" else 80),
        credentials=credentials,
        ca_file=ca_file,
    )


def _env(environ: Mapping[str, str], name: str) -> str:
    """The lower-case variable first, then the upper-case one (curl's order)."""
    return environ.get(name.lower()) or environ.get(name.upper()) or ""


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bypasses(no_proxy: str, host: str, port: int) -> bool:
    """Does the ``NO_PROXY`` list ``no_proxy`` exempt ``host:port`` (rules above)?"""
    host = host.strip("[]").lower().rstrip(".")
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.startswith("["):  # [v6]:port or [v6]
            inner, _, tail = entry[1:].partition("]")
            entry = inner
            if tail.startswith(":") and tail[1:].isdigit():
                entry_port = int(tail[1:])
        elif entry.count(":") == 1:
            name, _, port_text = entry.partition(":")
            if port_text.isdigit():
                entry, entry_port = name, int(port_text)
        if entry_port is not None and entry_port != port:
            continue
        if "/" in entry:
            try:
                net = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if addr is not None and addr.version == net.version and addr in net:
                return True
            continue
        try:
            entry_addr = ipaddress.ip_address(entry)
        except ValueError:
            entry_addr = None
        if entry_addr is not None:  # an address matches only itself
            if entry_addr == addr:
                return True
            continue
        entry = entry.rstrip(".")
        if entry.startswith("*."):
            entry = entry[1:]
        if entry.startswith("."):
            if host.endswith(entry):
                return True
        elif host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(
    host: str,
    port: int,
    *,
    url: str | None = None,
    no_proxy: str | None = None,
    ca_file: str | None = None,
    environ: Mapping[str, str],
) -> ProxyRoute | None:
    """The proxy for a tunnel to ``host:port``, or None to connect directly. ``url`` and
    ``no_proxy`` (the agent's config) take precedence over the environment (credentials from
    ``proxy.credentials_file`` are GatewayTransport's business). ValueError for a bad URL."""
    chosen = url if url is not None else _env(environ, "https_proxy")
    if not chosen or chosen.strip().lower() == DIRECT:
        return None
    exempt = no_proxy if no_proxy is not None else _env(environ, "no_proxy")
    if (url is None and _is_loopback(host)) or bypasses(exempt, host, port):
        return None
    return parse_proxy_url(chosen.strip(), ca_file=ca_file)
