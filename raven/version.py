"""Raven's version, for `--version` and ``raven_build_info``.

Written here once: the package metadata takes it from this file (pyproject.toml's
``[tool.setuptools.dynamic]``), so a running process never reads the installed metadata
(``importlib.metadata`` would load email, zipfile, csv and tempfile: ~2 MiB of every
process's RSS, issue 12)."""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES

#: The version of this tree (a release bumps it; the package metadata reads it).
__version__ = "0.1.0"

#: The distribution name on PyPI (the import packages are raven, cloud_gateway, edge_agent,
#: coredns_hosts).
DISTRIBUTION = "raven-edge"


def version() -> str:
    """The version of the running code."""
    return __version__


def python_version() -> str:
    """The running Python's version as ``platform.python_version()`` gives it ("3.11.7",
    "3.13.0rc1"), read from ``sys`` (the platform module is 0.2 MiB of a process's RSS)."""
    return sys.version.split()[0]


def python_implementation() -> str:
    """ "CPython", "PyPy"...: what ``platform.python_implementation()`` says."""
    name = sys.implementation.name
    return {"cpython": "CPython", "pypy": "PyPy"}.get(name, name)


def core_build() -> str:
    """``compiled`` when the sans-IO core runs as mypyc extension modules (``RAVEN_COMPILE=1``
    installs, ``scripts/build-compiled``), else ``pure``. Read off the files (Python's finder
    takes an extension module for this interpreter before the ``.py`` beside it), so asking
    imports nothing."""
    mux = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol", "mux")
    compiled = any(os.path.exists(mux + suffix) for suffix in EXTENSION_SUFFIXES)
    return "compiled" if compiled else "pure"


def version_line() -> str:
    """What ``raven --version`` prints."""
    uname = os.uname()
    return (
        f"raven {version()} ({DISTRIBUTION}; Python {python_version()}, "
        f"{uname.sysname.lower()}/{uname.machine}, core {core_build()})"
    )
