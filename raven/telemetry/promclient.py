"""prometheus-client's metric types, registry and collectors without its HTTP stack, and the
Prometheus text exposition every Raven process serves on /metrics.

``prometheus_client/__init__.py`` imports its ``exposition`` module, and that imports
http.server, socketserver, wsgiref, urllib.request, email and gzip for start_http_server,
push_to_gateway and make_wsgi_app, none of which Raven uses (its admin servers are
raven.admin): about 4 MiB of a process's RSS (issue 12). Importing this module first
registers the package ``prometheus_client`` with its ``__init__`` not yet run
(`register_package_without_init`): its submodules (metrics, registry, metrics_core, utils,
the parsers) import as usual, and the first name asked of the package itself (``from
prometheus_client import X`` anywhere: the gateway's aiohttp code, a test) runs the real
``__init__`` on that same module object, so nothing else changes. Raven code imports
prometheus-client's names from here.

`generate_text` writes what prometheus_client's ``generate_latest`` writes (the text format,
names escaped with underscores), so /metrics is byte for byte what it was.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import threading
from collections.abc import Callable, Iterable
from importlib.machinery import PathFinder
from typing import Any

PACKAGE = "prometheus_client"


def register_package_without_init() -> bool:
    """Put ``prometheus_client`` in sys.modules with its ``__init__`` deferred to the first
    attribute asked of it. False (and nothing done) when it is imported already or missing."""
    if PACKAGE in sys.modules:
        return False
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    lock = threading.Lock()

    def run_init(name: str) -> Any:
        # PEP 562: called only for a name the module does not have (yet). A submodule's
        # name (``from . import values`` in prometheus_client.metrics) is not there until
        # the import system imports it, which it does when this raises AttributeError.
        if PathFinder.find_spec(f"{PACKAGE}.{name}", package.__path__) is not None:
            raise AttributeError(name)
        with lock:
            if vars(package).pop("__getattr__", None) is not None:
                loader.exec_module(package)  # imports the submodules it still lacks
        return getattr(package, name)

    package.__getattr__ = run_init  # type: ignore[method-assign]
    sys.modules[PACKAGE] = package
    return True


register_package_without_init()

# the imports below must follow the registration above (E402)
from prometheus_client.metrics import (  # noqa: E402
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
)
from prometheus_client.metrics_core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402
from prometheus_client.samples import Sample  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Collector",
    "CollectorRegistry",
    "Counter",
    "CounterMetricFamily",
    "Gauge",
    "GaugeMetricFamily",
    "Histogram",
    "Metric",
    "ProcessCollector",
    "RenderedFamily",
    "Sample",
    "disable_created_metrics",
    "enable_created_metrics",
    "escape_label_value",
    "floatToGoString",
    "generate_text",
    "generate_text_off_loop",
    "register_package_without_init",
    "render_families",
]

#: The content type of `generate_text` (prometheus_client.exposition.CONTENT_TYPE_LATEST).
CONTENT_TYPE_LATEST = "text/plain; version=1.0.0; charset=utf-8"

#: OpenMetrics type -> (suffix of the family's name, type) in the text format
_TEXT_TYPES = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
#: OpenMetrics-only samples, written as gauges of their own after their family
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_DIGITS = frozenset("0123456789")


def _escape_name(name: str, valid: re.Pattern[str], extra: str = "") -> str:
    """A name as is when valid in the classic format, else each character that may not be
    there -> ``_`` (``extra``: what else is allowed: ``:`` in metric names)."""
    if not name or valid.fullmatch(name):
        return name
    return "".join(c if c in _NAME_START or c in extra or (i and c in _DIGITS) else "_"
                   for i, c in enumerate(name))  # fmt: skip


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it between double quotes."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _sample_line(sample: Sample) -> str:
    labels = ""
    if sample.labels:
        pairs = (f'{_escape_name(k, _LABEL_NAME)}="{escape_label_value(v)}"'
                 for k, v in sorted(sample.labels.items()))  # fmt: skip
        labels = "{" + ",".join(pairs) + "}"
    timestamp = ""
    if sample.timestamp is not None:  # in milliseconds
        timestamp = f" {int(float(sample.timestamp) * 1000):d}"
    name = _escape_name(sample.name, _METRIC_NAME, ":")
    value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
    return f"{name}{labels} {value}{timestamp}\n"


def _help_and_type(name: str, documentation: str, kind: str) -> str:
    name = _escape_name(name, _METRIC_NAME, ":")
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _family(metric: Metric, output: list[str]) -> None:
    suffix, kind = _TEXT_TYPES.get(metric.type, ("", metric.type))
    output.append(_help_and_type(metric.name + suffix, metric.documentation, kind))
    if isinstance(metric, RenderedFamily):
        output.append(metric.render())
        return
    om_samples: dict[str, list[str]] = {}
    for sample in metric.samples:
        for om_suffix in _OM_SUFFIXES:
            if sample.name == metric.name + om_suffix:
                om_samples.setdefault(om_suffix, []).append(_sample_line(sample))
                break
        else:
            output.append(_sample_line(sample))
    for om_suffix, lines in sorted(om_samples.items()):
        output.append(_help_and_type(metric.name + om_suffix, metric.documentation, "gauge"))
        output.extend(lines)


class RenderedFamily(Metric):
    """A family that writes its own text exposition: one of many series (a label per node)
    built from a snapshot in a few string operations per line, not a Sample object and a
    formatting pass per sample. ``samples`` (``registry.get_sample_value``, other formats) is
    built on first use only, from the same snapshot."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        render: Callable[[], str],
        samples: Callable[[], list[Sample]],
    ) -> None:
        self._samples: list[Sample] | None = None
        self._build_samples = samples
        super().__init__(name, documentation, typ)
        self.render = render

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = self._build_samples()
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:  # Metric.__init__ sets []
        self._samples = value or None


def render_families(families: Iterable[Metric]) -> bytes:
    """The text exposition of ``families`` (collected already: reads nothing live, so it may
    run in another thread)."""
    output: list[str] = []
    for metric in families:
        try:
            _family(metric, output)
        except Exception as exc:
            exc.args = (exc.args or ("",)) + (metric,)
            raise
    return "".join(output).encode("utf-8")


def generate_text(registry: Collector) -> bytes:
    """The Prometheus text exposition of every metric ``registry`` collects (what
    prometheus_client's ``generate_latest(registry)`` returns)."""
    return render_families(registry.collect())


async def generate_text_off_loop(registry: Collector) -> bytes:
    """`generate_text` for a process whose /metrics has many series (the gateway: a label per
    node): collected on the event loop (collectors read live state; a `RenderedFamily` takes
    a snapshot), written in a worker thread. The loop keeps serving meanwhile (the thread
    gives the GIL back every switch interval) instead of stalling every tunnel for as long as
    the text takes (1.4 s with 10,000 nodes before `RenderedFamily`)."""
    families = list(registry.collect())
    return await asyncio.to_thread(render_families, families)
