"""What every Raven process exposes besides its own metrics: ``raven_build_info`` and
prometheus-client's ``process_*`` and ``python_info`` collectors, on a process's registry.

``*_created`` series are off (they double the series count of every counter and histogram
for little use) unless ``RAVEN_CREATED_SERIES=true`` asks for them.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator

from raven.promclient import (
    Collector,
    CollectorRegistry,
    GaugeMetricFamily,
    Metric,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    enable_created_metrics,
)
from raven.version import version

#: Set to true to expose the ``_created`` series of counters and histograms.
CREATED_SERIES_ENV = "RAVEN_CREATED_SERIES"


class BuildInfoCollector(Collector):
    """``raven_build_info{version, python_version} 1``, as Prometheus's own build_info."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "raven_build_info",
            "Raven's version and the Python it runs on; always 1.",
            labels=["version", "python_version"],
        )
        family.add_metric([version(), platform.python_version()], 1)
        yield family


def apply_created_series_setting() -> None:
    """Turn the ``_created`` series off unless RAVEN_CREATED_SERIES asks for them."""
    if os.environ.get(CREATED_SERIES_ENV, "").lower() in ("1", "true", "yes"):
        enable_created_metrics()  # type: ignore[no-untyped-call]
    else:
        disable_created_metrics()  # type: ignore[no-untyped-call]


def add_process_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """Register build info, process and platform collectors on ``registry``."""
    apply_created_series_setting()
    registry.register(BuildInfoCollector())
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def process_registry() -> CollectorRegistry:
    """A new registry for one process, with :func:`add_process_metrics` applied."""
    return add_process_metrics(CollectorRegistry(auto_describe=True))
