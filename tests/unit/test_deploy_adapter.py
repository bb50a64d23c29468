"""deploy/prometheus-adapter: every rule matches what the GPU exporter really emits, in each of
its label modes: gpu-adapter-rules.yaml for the upstream (dcgm-exporter) labels with either
``--hostname-label`` (``Hostname``, ``hostname``), ack-adapter-rules.yaml for ``--label-mode
ack``; every metric the HPA example reads is served in every mode."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.cli import build_exporter
from gpu_exporter.exposition import HOSTNAME_LABELS, LABEL_MODES
from raven_cli.main import build_parser
from tests.helpers import load_script
from tests.helpers.deploy import ROOT

ADAPTER = ROOT / "deploy" / "prometheus-adapter"


#: (label mode, hostname label) -> the rules file for it.
MODES = {
    **{("upstream", h): "gpu-adapter-rules.yaml" for h in HOSTNAME_LABELS},
    ("ack", "Hostname"): "ack-adapter-rules.yaml",
}


def test_every_label_mode_has_its_rules() -> None:
    assert {mode for mode, _ in MODES} == set(LABEL_MODES)


def series(label_mode: str, hostname_label: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample a simulated exporter serves in this label mode."""
    args = build_parser().parse_args(
        ["gpu-exporter", "--simulate", "2", "--seed", "0", "--load-profile", "training",
         "--hostname", "edge-gpu-1", "--hostname-label", hostname_label,
         "--label-mode", label_mode]
    )  # fmt: skip
    exporter = build_exporter(args)
    try:
        exporter.collect_blocking()
        text = exporter.exposition().decode()
    finally:
        exporter.backend.close()
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def rules(file: str) -> list[dict[str, Any]]:
    (cm,) = [d for d in yaml.safe_load_all((ADAPTER / file).read_text()) if d]
    found: list[dict[str, Any]] = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    return found


def served_name(rule: dict[str, Any]) -> str:
    """The custom metric name the rule serves (its ``name.matches`` -> ``name.as``)."""
    series_name = rule["seriesQuery"].split("{", 1)[0]
    name = rule.get("name", {})
    if "as" not in name:
        return series_name
    as_ = re.sub(r"\$\{(\d+)\}", r"\\\1", name["as"])
    return re.sub(name.get("matches", "^(.*)$"), as_, series_name)


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


@pytest.mark.parametrize(("label_mode", "hostname_label"), sorted(MODES))
def test_every_rule_discovers_series_and_the_hpa_reads_served_metrics(
    label_mode: str, hostname_label: str
) -> None:
    samples = series(label_mode, hostname_label)
    file = MODES[(label_mode, hostname_label)]
    served: dict[str, bool] = {}
    for rule in rules(file):
        name = served_name(rule)
        served[name] = served.get(name, False) or discovers(rule, samples)
    missing = [name for name, ok in served.items() if not ok]
    assert missing == [], f"{file} with --label-mode {label_mode} --hostname-label {hostname_label}"
    for rule in rules(file):  # each rule is for this mode or for the other hostname label
        other = [s for (m, h), f in MODES.items() if f == file for s in series(m, h)]
        assert discovers(rule, other), rule["seriesQuery"]
    (hpa,) = [d for d in yaml.safe_load_all((ADAPTER / "hpa-gpu-example.yaml").read_text()) if d]
    for metric in hpa["spec"]["metrics"]:
        assert served.get(metric["pods"]["metric"]["name"]), metric


#: The prometheus-adapter chart's values this project sets, as its values.yaml documents them
#: (prometheus-community/helm-charts, charts/prometheus-adapter: ``prometheus.url/port/path``;
#: ``rules.default/custom/existing/external/resource``; a rule as in prometheus-adapter's
#: docs/config.md: seriesQuery, seriesFilters, resources (overrides or template), name
#: (matches, as), metricsQuery). The chart ships no values.schema.json: this is the check.
RULE_SCHEMA = {
    "type": "object",
    "required": ["seriesQuery", "resources", "metricsQuery"],
    "additionalProperties": False,
    "properties": {
        "seriesQuery": {"type": "string", "minLength": 1},
        "seriesFilters": {"type": "array", "items": {"type": "object"}},
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "template": {"type": "string"},
                "overrides": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["resource"],
                        "properties": {"group": {"type": "string"}, "resource": {"type": "string"}},
                        "additionalProperties": False,
                    },
                },
            },
        },
        "name": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"matches": {"type": "string"}, "as": {"type": "string"}},
        },
        "metricsQuery": {"type": "string", "pattern": "<<\\.Series>>"},
    },
}
ADAPTER_VALUES_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "prometheus": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url", "port"],
            "properties": {
                "url": {"type": "string", "pattern": "^https?://"},
                "port": {"type": "integer"},
                "path": {"type": "string"},
            },
        },
        "rules": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "default": {"type": "boolean"},
                "custom": {"type": "array", "items": RULE_SCHEMA, "minItems": 1},
                "existing": {"type": ["string", "null"]},
                "external": {"type": "array", "items": RULE_SCHEMA},
                "resource": {"type": "object"},
            },
        },
    },
}


def gen_adapter_values() -> ModuleType:
    return load_script(ROOT / "scripts/gen_adapter_values.py")


@pytest.mark.parametrize(
    "name", ["values-prometheus-adapter.yaml", "values-prometheus-adapter-ack.yaml"]
)
def test_adapter_chart_values_carry_the_rules(name: str) -> None:
    """The values file for the upstream chart is what the generator writes from the rules
    ConfigMap (one source), fits the chart's documented values, and its rules are the ones
    the HPA test above checks: the chart puts ``rules.custom`` verbatim under ``rules:``."""
    gen = gen_adapter_values()
    text = (ADAPTER / name).read_text()
    assert text == gen.render(name), "run scripts/gen_adapter_values.py"
    values = yaml.safe_load(text)
    jsonschema.validate(values, ADAPTER_VALUES_SCHEMA)
    rules_file = gen.VALUES[name][0]
    assert values["rules"]["custom"] == rules(rules_file)
    assert values["rules"]["default"] is False
    assert ".svc" in values["prometheus"]["url"]


def test_the_docs_install_the_adapter_with_the_values_file() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    step = text.split("## 9. ", 1)[1].split("\n## ", 1)[0]
    assert "helm install prometheus-adapter prometheus-community/prometheus-adapter" in step
    assert "-f deploy/prometheus-adapter/values-prometheus-adapter.yaml" in step
    assert "custom.metrics.k8s.io" in step
