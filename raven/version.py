"""The installed version of Raven (from the package metadata), for `--version` and
``raven_build_info``."""

from __future__ import annotations

import platform
from importlib import metadata

#: The distribution name on PyPI (the import packages are raven, cloud_gateway, edge_agent,
#: coredns_hosts).
DISTRIBUTION = "raven-edge"


def version() -> str:
    """The installed version, or ``0+unknown`` when run from a tree that is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def version_line() -> str:
    """What ``raven --version`` prints."""
    return (
        f"raven {version()} ({DISTRIBUTION}; Python {platform.python_version()}, "
        f"{platform.system().lower()}/{platform.machine()})"
    )
