"""Which edge target a request is for: the four addressing modes (pure).

- DNS mode: origin-form request, ``Host: <node>:<port>`` (port 80 when absent).
- Forward-proxy mode: absolute-form ``GET http://<node>:<port>/path`` (``proxy_url``).
- CONNECT mode: ``CONNECT <node>:<port>`` (port required); TLS stays end to end.
- Path mode: ``GET /proxy/<node>:<port>/<path>`` (port required), for relabelled setups.
- TLS mode (the SNI listener, not HTTP): ``<sni>:<listener's target port>``.

Only node names are targets, never IP literals: the gateway is not an open proxy.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from cloud_gateway.proxy.errors import ErrorKind, ProxyError
from cloud_gateway.proxy.heads import RequestHead
from raven.protocol.names import is_ip_literal, is_valid_node_name, normalize_node_name

#: Path-mode prefix: ``/proxy/<node>:<port>/<path>``.
PATH_PREFIX = "/proxy/"
#: Port of an http target addressed without one.
DEFAULT_HTTP_PORT = 80


class Mode(enum.Enum):
    """How the client addressed the target; ``value`` is the ``mode`` metric label."""

    DNS = "dns"
    FORWARD = "forward"
    CONNECT = "connect"
    PATH = "path"
    TLS = "tls"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: ``node``:``port``, and the origin-form ``path`` to request there."""

    mode: Mode
    node: str
    port: int
    path: str = ""

    @property
    def authority(self) -> str:
        return f"{self.node}:{self.port}"


def check_node(name: str) -> str:
    """The normalised node name, or :class:`ProxyError` (IP literal / not a node name).
    An absolute name in a Host header (``edge-gpu-7.``, one trailing dot) is its node's."""
    name = name[:-1] if name.endswith(".") else name
    if is_ip_literal(name):
        raise ProxyError(ErrorKind.IP_LITERAL, f"{name} is an IP address; use a node name")
    if not is_valid_node_name(name):
        raise ProxyError(ErrorKind.BAD_TARGET, f"{name[:80]!r} is not a valid node name")
    return normalize_node_name(name)


@functools.lru_cache(maxsize=8192)
def parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``node[:port]`` -> (node, port); IP literals and user-info are refused.

    Cached: a fleet has a bounded set of ``node:port`` strings and every scrape repeats one
    (refusals raise and are not cached).
    """
    if "@" in text:
        raise ProxyError(ErrorKind.BAD_TARGET, "user-info in target authority")
    if text.startswith("["):
        host = text[1:].partition("]")[0]
        if is_ip_literal(host):
            raise ProxyError(ErrorKind.IP_LITERAL, f"[{host}] is an IP address; use a node name")
        raise ProxyError(ErrorKind.BAD_TARGET, f"invalid authority {text[:80]!r}")
    if text.count(":") > 1:
        if is_ip_literal(text):
            raise ProxyError(ErrorKind.IP_LITERAL, f"{text} is an IP address; use a node name")
        raise ProxyError(ErrorKind.BAD_TARGET, f"invalid authority {text[:80]!r}")
    host, sep, port_text = text.partition(":")
    node = check_node(host)
    if not sep:
        if default_port is None:
            raise ProxyError(ErrorKind.BAD_TARGET, f"{text[:80]!r}: a port is required")
        return node, default_port
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise ProxyError(ErrorKind.BAD_TARGET, f"invalid port {port_text[:10]!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ProxyError(ErrorKind.BAD_TARGET, f"port {port} out of range")
    return node, port


def _split_authority(rest: str) -> tuple[str, str]:
    """``auth/path?q`` -> (``auth``, ``/path?q``); a missing path becomes ``/``."""
    cut = len(rest)
    for sep in "/?":
        idx = rest.find(sep)
        if 0 <= idx < cut:
            cut = idx
    authority, path = rest[:cut], rest[cut:]
    if not path.startswith("/"):
        path = "/" + path
    return authority, path


def resolve_target(req: RequestHead) -> Target:
    """The target of an HTTP request, or :class:`ProxyError` saying why there is none."""
    target = req.target
    if req.method == "CONNECT":
        node, port = parse_authority(target, None)
        return Target(Mode.CONNECT, node, port)
    scheme, sep, rest = target.partition("://")
    if sep and "/" not in scheme:
        if scheme.lower() != "http":
            raise ProxyError(ErrorKind.BAD_TARGET, f"scheme {scheme[:10]!r}: use CONNECT for TLS")
        authority, path = _split_authority(rest)
        node, port = parse_authority(authority, DEFAULT_HTTP_PORT)
        return Target(Mode.FORWARD, node, port, path)
    if not target.startswith("/"):
        raise ProxyError(ErrorKind.BAD_TARGET, "request target must be a path or an http URL")
    if target.startswith(PATH_PREFIX):
        authority, path = _split_authority(target[len(PATH_PREFIX) :])
        node, port = parse_authority(authority, None)
        return Target(Mode.PATH, node, port, path)
    if req.host is None:
        raise ProxyError(ErrorKind.MALFORMED, "no Host header")
    node, port = parse_authority(req.host, DEFAULT_HTTP_PORT)
    return Target(Mode.DNS, node, port, target)
