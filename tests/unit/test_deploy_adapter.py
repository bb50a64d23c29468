"""deploy/prometheus-adapter: every rule matches what the GPU exporter really emits, in each of
its label modes (``--hostname-label Hostname`` and ``hostname``), and every metric the HPA
example reads is served by a rule that discovers series in every mode."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.cli import build_exporter
from gpu_exporter.exposition import HOSTNAME_LABELS
from raven.cli import build_parser
from tests.unit.test_deploy_common import ROOT

ADAPTER = ROOT / "deploy" / "prometheus-adapter"


def series(hostname_label: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample a simulated exporter serves in this label mode."""
    args = build_parser().parse_args(
        ["gpu-exporter", "--simulate", "2", "--seed", "0", "--load-profile", "training",
         "--hostname", "edge-gpu-1", "--hostname-label", hostname_label]
    )  # fmt: skip
    exporter = build_exporter(args)
    try:
        exporter.collect_blocking()
        text = exporter.exposition().decode()
    finally:
        exporter.backend.close()
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def rules() -> list[dict[str, Any]]:
    (cm,) = [d for d in yaml.safe_load_all((ADAPTER / "gpu-adapter-rules.yaml").read_text()) if d]
    found: list[dict[str, Any]] = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    return found


def served_name(rule: dict[str, Any]) -> str:
    """The custom metric name the rule serves (its ``name.matches`` -> ``name.as``)."""
    series_name = rule["seriesQuery"].split("{", 1)[0]
    as_ = re.sub(r"\$\{(\d+)\}", r"\\\1", rule["name"]["as"])
    return re.sub(rule["name"]["matches"], as_, series_name)


def discovers(rule: dict[str, Any], samples: list[tuple[str, dict[str, str]]]) -> bool:
    """Whether the rule's seriesQuery selects a sample carrying every override label."""
    m = re.fullmatch(r"(\w+)\{(.*)\}", rule["seriesQuery"])
    assert m is not None, rule["seriesQuery"]
    name, matchers = m.groups()
    required = re.findall(r'(\w+)!=""', matchers)
    overrides = set(rule["resources"]["overrides"])
    return any(
        n == name and all(labels.get(k) for k in required) and overrides <= set(labels)
        for n, labels in samples
    )


@pytest.mark.parametrize("hostname_label", HOSTNAME_LABELS)
def test_every_adapter_metric_is_discovered_in_each_label_mode(hostname_label: str) -> None:
    samples = series(hostname_label)
    served: dict[str, bool] = {}
    for rule in rules():
        name = served_name(rule)
        served[name] = served.get(name, False) or discovers(rule, samples)
    missing = [name for name, ok in served.items() if not ok]
    assert missing == [], f"--hostname-label {hostname_label}: no rule discovers {missing}"


def test_every_rule_discovers_series_in_some_mode_and_the_hpa_reads_served_metrics() -> None:
    by_mode = {mode: series(mode) for mode in HOSTNAME_LABELS}
    for rule in rules():
        assert any(discovers(rule, s) for s in by_mode.values()), rule["seriesQuery"]
    served = {served_name(r) for r in rules()}
    (hpa,) = [d for d in yaml.safe_load_all((ADAPTER / "hpa-gpu-example.yaml").read_text()) if d]
    for metric in hpa["spec"]["metrics"]:
        assert metric["pods"]["metric"]["name"] in served
