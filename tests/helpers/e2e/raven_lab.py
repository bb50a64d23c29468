"""The Raven side of the end-to-end labs: the ports the gateway listens on in them, the
Prometheus binary, and a check that the `raven` subcommands a test drives exist."""

from __future__ import annotations

import functools
import re
import subprocess
import sys

from tests.helpers import raven_cmd, require

PROMETHEUS = "/usr/bin/prometheus"
PROXY_PORT = 10264
TUNNEL_PORT = 10262
ADMIN = ("127.0.0.1", 10265)


@functools.cache
def raven_subcommands() -> frozenset[str]:
    """The subcommands ``raven --help`` lists (one call: each start costs a second)."""
    out = subprocess.run(
        [*raven_cmd(), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    words = re.findall(r"^ {4}([a-z][a-z0-9-]+)(?:\s|$)", out.stdout, re.MULTILINE)
    return frozenset(words)


def hosts_cmd() -> list[str]:
    """``raven coredns-hosts`` once it is wired into the CLI, else its module."""
    if "coredns-hosts" in raven_subcommands():
        return [*raven_cmd(), "coredns-hosts"]
    return [sys.executable, "-m", "coredns_hosts"]


def check_components() -> None:
    """The Raven parts this test drives must exist."""
    missing = [c for c in ("gateway", "agent", "gpu-exporter") if c not in raven_subcommands()]
    require(not missing, f"raven subcommand(s) missing: {', '.join(missing)}")
