"""raven.telemetry.promclient: prometheus-client without its HTTP stack (the package's __init__
deferred until a name of the package itself is asked), and a text exposition that is byte for byte
prometheus_client's generate_latest."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import prometheus_client.metrics
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from raven.telemetry import promclient


class Families:
    """Hand-made families: every type, timestamps, odd label values and names."""

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily("c_events", "Events\\ with\nnewline.", labels=["k"])
        counter.add_metric(['a"b\\c\nd'], 3, timestamp=1700000000.123)
        counter.add_metric(["ünïcode ✓"], float("inf"))
        yield counter
        gauge = GaugeMetricFamily("g_level", "Level.", labels=["le_", "__x"])
        gauge.add_metric(["1", "2"], float("nan"))
        gauge.add_metric(["3", "4"], -0.0)
        gauge.add_metric(["5", "6"], 1e21)
        yield gauge
        yield InfoMetricFamily("i_build", "Build.", value={"version": "1.2", "commit": "x"})
        yield StateSetMetricFamily("s_mode", "Mode.", value={"on": True, "off": False})
        gh = GaugeHistogramMetricFamily("gh_q", "Queue.", buckets=[("1", 2), ("+Inf", 5)],
                                        gsum_value=7)  # fmt: skip
        yield gh
        yield UnknownMetricFamily("u_thing", "Untyped.", value=4)
        yield GaugeMetricFamily("weird.name-with:colon", "Escaped name.", value=1)
        yield GaugeMetricFamily("9starts_with_digit", "Escaped name.", value=2)
        with_labels = GaugeMetricFamily("bad_label", "Escaped label.", labels=["a.b", "7c"])
        with_labels.add_metric(["x", "y"], 1)
        yield with_labels


class Frozen:
    """Families collected once, collected again unchanged."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def full_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    Counter("requests", "Requests.", ["code"], registry=registry).labels("200").inc(5)
    Gauge("temperature_celsius", "Temp.", registry=registry).set(21.5)
    h = Histogram("latency_seconds", "Latency.", ["path"], buckets=(0.1, 1), registry=registry)
    h.labels("/a").observe(0.05)
    h.labels("/b").observe(3)
    Summary("size_bytes", "Sizes.", registry=registry).observe(512)
    Info("build", "Build.", registry=registry).info({"version": "1"})
    Enum("state", "State.", states=["up", "down"], registry=registry).state("down")
    registry.register(Families())
    return registry


def test_text_exposition_is_prometheus_clients() -> None:
    was_created = prometheus_client.metrics._use_created
    try:
        for created in (False, True):
            if created:
                enable_created_metrics()  # type: ignore[no-untyped-call]
            else:
                disable_created_metrics()  # type: ignore[no-untyped-call]
            registry = full_registry()
            assert promclient.generate_text(registry) == generate_latest(registry)
    finally:
        prometheus_client.metrics._use_created = was_created
    process = CollectorRegistry(auto_describe=True)
    process.register(promclient.ProcessCollector(registry=None))
    frozen = Frozen(list(process.collect()))  # the CPU seconds move between two calls
    assert promclient.generate_text(frozen) == generate_latest(frozen)
    assert promclient.CONTENT_TYPE_LATEST == CONTENT_TYPE_LATEST


def test_a_failing_collector_is_named_in_the_error() -> None:
    class Broken:
        def collect(self) -> Iterator[Metric]:
            family = GaugeMetricFamily("broken", "Broken.")
            family.add_sample("broken", {}, "not a number")  # type: ignore[arg-type]
            yield family

    registry = CollectorRegistry()
    registry.register(Broken())
    try:
        promclient.generate_text(registry)
    except (TypeError, ValueError) as exc:
        assert any(isinstance(arg, Metric) for arg in exc.args)
    else:
        raise AssertionError("expected an error")


def run_python(code: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_prometheus_clients_http_stack_is_not_imported_until_the_package_is_asked() -> None:
    got = run_python(
        "import json, sys\n"
        "import raven.telemetry.promclient as p\n"
        "before = sorted(sys.modules)\n"
        "from prometheus_client import CollectorRegistry, generate_latest\n"
        "import prometheus_client.exposition\n"
        "r = p.CollectorRegistry(); p.Counter('x', 'X.', registry=r).inc()\n"
        "print(json.dumps({'before': before, 'after': sorted(sys.modules),\n"
        "                  'same': CollectorRegistry is p.CollectorRegistry,\n"
        "                  'text': generate_latest(r) == p.generate_text(r)}))\n"
    )
    before, after = set(got["before"]), set(got["after"])  # type: ignore[call-overload]
    heavy = {"prometheus_client.exposition", "http.server", "wsgiref", "urllib.request", "email"}
    assert not heavy & before
    assert heavy <= after  # the real __init__ ran, on the same package
    assert got["same"] is True and got["text"] is True


def test_python_info_is_what_prometheus_clients_platform_collector_writes() -> None:
    from prometheus_client.platform_collector import PlatformCollector

    from raven.telemetry.process_metrics import PythonInfoCollector

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    theirs.register(PlatformCollector(registry=None))
    ours.register(PythonInfoCollector())
    assert promclient.generate_text(ours) == generate_latest(theirs)


def test_production_code_takes_prometheus_client_names_from_promclient_only() -> None:
    """One way in: a module asking the package itself for a name (``from prometheus_client
    import Counter``) runs its deferred __init__, HTTP stack and all; submodules (the
    parsers) are fine."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    folders = ["raven", "raven_cli", "cloud_gateway", "edge_agent", "gpu_exporter",
               "coredns-hosts/coredns_hosts"]  # fmt: skip
    offenders = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                direct = (
                    isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
                ) or (
                    isinstance(node, ast.Import)
                    and any(a.name == "prometheus_client" for a in node.names)
                )
                if direct:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
