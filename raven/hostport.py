"""``host:port`` text -> (host, port): the one parser for listen addresses, gateway addresses
and DNS servers."""

from __future__ import annotations


class AddressError(ValueError):
    """The text is not ``host:port`` (the message quotes it and says what is wrong)."""


def parse_hostport(
    value: str, default_port: int | None = None, *, default_host: str = "0.0.0.0"
) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``:port`` (``default_host``: every address) -> (host, port).

    Without a port (``host``, ``[v6]``, a bare IPv6 address) the port is ``default_port``, and
    an error when there is none. Ports are 0-65535 (0: any free port, for listeners).
    """
    text = value.strip()
    if not text:
        raise AddressError("empty address")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise AddressError(f"{value!r}: missing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise AddressError(f"{value!r}: unexpected {rest[:20]!r} after ']'")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""  # a name, an IPv4 address or a bare IPv6 address
    if not port_text:
        if default_port is None:
            raise AddressError(f"{value!r}: a port is required (host:port)")
        return host or default_host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise AddressError(f"{value!r}: bad port {port_text!r}")
    return host or default_host, int(port_text)
