"""The build backend (pyproject.toml's ``build-backend``): setuptools', plus mypy in the
isolated build environment when ``RAVEN_COMPILE=1`` asks for the compiled core (setup.py)."""

from __future__ import annotations

import os

from setuptools import build_meta
from setuptools.build_meta import (
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

#: mypyc ships with mypy (the core is checked with mypy >= 1.10, pyproject's test extra); it
#: type-checks what it compiles, so the typed dependencies the core imports come too
#: (cryptography for the AEADs, prometheus-client for raven/l3's counters, the PyYAML stubs for
#: the configuration the proxy modules of the hot path import)
COMPILE_REQUIREMENTS = [
    "mypy>=1.10",
    "cryptography>=42",
    "prometheus-client>=0.20",
    "types-PyYAML",
]


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    requires = list(build_meta.get_requires_for_build_wheel(config_settings))
    if os.environ.get("RAVEN_COMPILE") == "1":
        requires += COMPILE_REQUIREMENTS
    return requires
