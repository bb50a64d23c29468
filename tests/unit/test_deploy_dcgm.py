"""deploy/dcgm-exporter: upstream dcgm-exporter's chart values for a cluster with edge sites.
Kube-prometheus-stack must never scrape an edge pod at its address: the edge install has no
ServiceMonitor and runs only on edge nodes; the cloud install keeps its ServiceMonitor (with
the label the operator selects by) and never runs on an edge node. Both use only keys the
chart's values.yaml documents (serviceMonitor.enabled/additionalLabels/interval, affinity)."""

from __future__ import annotations

from typing import Any

import jsonschema
import yaml

from tests.helpers.deploy import ROOT

DCGM = ROOT / "deploy" / "dcgm-exporter"
#: The keys of NVIDIA's dcgm-exporter chart (deployment/values.yaml) these files set.
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "serviceMonitor": {
            "type": "object",
            "additionalProperties": False,
            "required": ["enabled"],
            "properties": {
                "enabled": {"type": "boolean"},
                "interval": {"type": "string"},
                "additionalLabels": {"type": "object"},
            },
        },
        "affinity": {"type": "object", "required": ["nodeAffinity"]},
    },
}


def values(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DCGM / name).read_text())
    jsonschema.validate(data, SCHEMA)
    return data


def site_rule(data: dict[str, Any]) -> dict[str, str]:
    required = data["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = required["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    return dict(expression)


def test_edge_pods_are_never_scraped_at_their_addresses() -> None:
    edge, cloud = values("values-edge.yaml"), values("values-cloud.yaml")
    assert edge["serviceMonitor"]["enabled"] is False
    assert site_rule(edge) == {"key": "raven.io/site", "operator": "Exists"}
    assert cloud["serviceMonitor"]["enabled"] is True
    assert cloud["serviceMonitor"]["additionalLabels"] == {"release": "kube-prometheus-stack"}
    assert site_rule(cloud) == {"key": "raven.io/site", "operator": "DoesNotExist"}


def test_the_docs_install_both() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "-f deploy/dcgm-exporter/values-edge.yaml" in text
    assert "-f deploy/dcgm-exporter/values-cloud.yaml" in text
