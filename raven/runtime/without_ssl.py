"""Run a process that speaks no TLS without the ``ssl`` module.

asyncio imports ``ssl`` as it loads (for its TLS transports), and ``ssl`` maps the system's
libssl and libcrypto and builds its enums: 4.4 MiB of a `raven agent`'s RSS (issue 12),
for a process whose tunnel is Noise and whose admin server and targets are plain HTTP.
`forgo_ssl` marks ``ssl`` as absent before asyncio is imported; asyncio (and aiohttp and
dnspython, which the agent may load) then run as on a Python built without ``ssl``, which
they support: each imports it in a ``try`` and leaves TLS off. Whether a process may do
without is the caller's decision (`raven.config.agent.AgentConfig.needs_ssl`: the
Kubernetes API client and uvloop need it).
"""

from __future__ import annotations

import sys

__all__ = ["forgo_ssl"]


def forgo_ssl() -> bool:
    """Make ``import ssl`` fail with ImportError in this process from now on. False (and
    nothing done) when ``ssl`` is imported already (asyncio was loaded first)."""
    if "ssl" in sys.modules:
        return False
    sys.modules["ssl"] = None  # type: ignore[assignment]
    return True
