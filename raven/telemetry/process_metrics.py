"""What every Raven process exposes besides its own metrics: ``raven_build_info``,
prometheus-client's ``process_*`` collector and ``python_info`` (as its PlatformCollector
writes it), on a process's registry.

``*_created`` series are off (they double the series count of every counter and histogram
for little use) unless ``RAVEN_CREATED_SERIES=true`` asks for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from raven.telemetry.promclient import (
    Collector,
    CollectorRegistry,
    GaugeMetricFamily,
    Metric,
    ProcessCollector,
    disable_created_metrics,
    enable_created_metrics,
)
from raven.version import core_build, python_implementation, python_version, version

#: Set to true to expose the ``_created`` series of counters and histograms.
CREATED_SERIES_ENV = "RAVEN_CREATED_SERIES"


class BuildInfoCollector(Collector):
    """``raven_build_info{version, python_version, core} 1``, as Prometheus's own build_info
    (``core``: ``compiled`` or ``pure``, the build of the sans-IO core)."""

    def __init__(self) -> None:
        self._labels = [version(), python_version(), core_build()]  # fixed for the process

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "raven_build_info",
            "Raven's version, the Python it runs on and its core's build; always 1.",
            labels=["version", "python_version", "core"],
        )
        family.add_metric(self._labels, 1)
        yield family


class PythonInfoCollector(Collector):
    """``python_info{version, implementation, major, minor, patchlevel} 1``, the family
    prometheus-client's PlatformCollector writes, from ``sys`` (PlatformCollector imports the
    platform module: 0.2 MiB of a process's RSS)."""

    def collect(self) -> Iterator[Metric]:
        text = python_version()
        major, minor, patchlevel = text.split(".", 2)
        family = GaugeMetricFamily(
            "python_info",
            "Python platform information",
            labels=["version", "implementation", "major", "minor", "patchlevel"],
        )
        family.add_metric([text, python_implementation(), major, minor, patchlevel], 1)
        yield family


def apply_created_series_setting() -> None:
    """Turn the ``_created`` series off unless RAVEN_CREATED_SERIES asks for them."""
    if os.environ.get(CREATED_SERIES_ENV, "").lower() in ("1", "true", "yes"):
        enable_created_metrics()  # type: ignore[no-untyped-call]
    else:
        disable_created_metrics()  # type: ignore[no-untyped-call]


def add_process_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """Register build info, process and Python collectors on ``registry``."""
    apply_created_series_setting()
    registry.register(BuildInfoCollector())
    ProcessCollector(registry=registry)
    registry.register(PythonInfoCollector())
    return registry


def process_registry() -> CollectorRegistry:
    """A new registry for one process, with :func:`add_process_metrics` applied."""
    return add_process_metrics(CollectorRegistry(auto_describe=True))
