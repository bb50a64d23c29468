"""Raven's version, for `--version` and ``raven_build_info``.

Written here once: the package metadata takes it from this file (pyproject.toml's
``[tool.setuptools.dynamic]``), so a running process never reads the installed metadata
(``importlib.metadata`` would load email, zipfile, csv and tempfile: ~2 MiB of every
process's RSS, issue 12)."""

from __future__ import annotations

import platform

#: The version of this tree (a release bumps it; the package metadata reads it).
__version__ = "0.1.0"

#: The distribution name on PyPI (the import packages are raven, cloud_gateway, edge_agent,
#: coredns_hosts).
DISTRIBUTION = "raven-edge"


def version() -> str:
    """The version of the running code."""
    return __version__


def version_line() -> str:
    """What ``raven --version`` prints."""
    return (
        f"raven {version()} ({DISTRIBUTION}; Python {platform.python_version()}, "
        f"{platform.system().lower()}/{platform.machine()})"
    )
