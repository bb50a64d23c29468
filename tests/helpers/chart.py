"""The Helm chart as the deployment tests render it: real Helm (``helm-python-sdk``, Helm v4's
Go SDK), and the values of every variant they check (docs/kubernetes.md's, backfill, L3,
kube-prometheus-stack, one address for every replica, the GPU exporter...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import helm_python as helm
import yaml

from raven import keys
from tests.helpers.deploy import ROOT

CHART = ROOT / "deploy" / "helm" / "raven"
RELEASE, NAMESPACE = "raven", "raven-system"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def render(values: dict[str, Any], release: str = RELEASE) -> list[dict[str, Any]]:
    """``helm template <release> deploy/helm/raven -n raven-system -f values``."""
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=release, namespace=NAMESPACE)
    objs: list[dict[str, Any]] = []
    for name in sorted(out):
        if not name.endswith("NOTES.txt"):
            objs.extend(d for d in yaml.safe_load_all(out[name]) if d)
    return objs


def public_key() -> str:
    return keys.encode_key(keys.public_key(keys.generate_private_key()))


def site(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "publicKey": public_key(),
        "existingSecret": f"raven-agent-key-{name}",
        "nodes": [f"{name}-*"],
        **extra,
    }


def base_values() -> dict[str, Any]:
    return {"gateway": {"publicKey": public_key(), "existingSecret": "raven-gateway-key"}}


def two_sites(*, l3: bool = False) -> dict[str, Any]:
    """A named and a numeric site ("123" stays a string only if the chart quotes it)."""
    sites = [site("site-a"), site("123", allowedPorts=[9400, 10250])]
    if l3:
        sites[0] |= {"prefixes": ["192.168.50.0/24"], "tunAddress": "10.99.0.2/24"}
        sites[1] |= {"prefixes": ["192.168.60.0/24"], "tunAddress": "10.99.0.3/24"}
    values = base_values() | {"sites": sites, "l3": {"enabled": l3}}
    values["gateway"]["extraConfig"] = {"handshake_rate_per_s": 5.0}
    values["agent"] = {"extraConfig": {"reconnect": {"max_backoff_s": 10.0}}}
    return values


KPS_LABELS = {"release": "kube-prometheus-stack"}


def kube_prometheus_stack() -> dict[str, Any]:
    """The values docs/kubernetes.md gives for kube-prometheus-stack."""
    values = two_sites()
    monitoring = {"enabled": True, "namespace": "monitoring", "additionalLabels": KPS_LABELS}
    values |= {
        "serviceMonitor": dict(monitoring),
        "scrapeConfig": monitoring | {"ports": [9400, 9100]},
        "prometheusRule": dict(monitoring),
        "grafanaDashboards": {"enabled": True, "namespace": "monitoring"},
        "imagePullSecrets": ["regcred", {"name": "other"}],
        "global": {"imagePullSecrets": ["global-cred"]},
        "commonLabels": {"team": "gpu-platform"},
    }
    values["agent"]["services"] = ["gpu-operator/nvidia-dcgm-exporter"]
    return values


def documented_values() -> dict[str, Any]:
    """The ``values-kps.yaml`` block of docs/kubernetes.md, public keys filled in."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    block = text.split("<!-- values: kube-prometheus-stack -->\n```yaml\n", 1)[1].split("```", 1)[0]
    for placeholder in ("<gateway.pub>", "<site-a.pub>"):
        assert placeholder in block
        block = block.replace(placeholder, public_key())
    values: dict[str, Any] = yaml.safe_load(block)
    return values


def with_admin_token() -> dict[str, Any]:
    values = kube_prometheus_stack()
    values["adminToken"] = {"existingSecret": "raven-admin-token"}
    return values


def with_backfill() -> dict[str, Any]:
    """Backfill on, jobs from the ScrapeConfig's ports, a buffer PersistentVolumeClaim per site."""
    values = kube_prometheus_stack()
    values["gateway"]["backfill"] = {"enabled": True, "outOfOrderWindowSeconds": 7200}
    values["agent"]["backfill"] = {
        "enabled": True,
        "maxAgeSeconds": 7200,
        "extraConfig": {
            "send_bytes_per_s": 1000000,
            "targets": [{"node": "site-a-gpu-1", "port": 9400}],
        },
        "persistence": {"storageClass": "local-path", "size": "3Gi", "annotations": {"a": "b"}},
    }  # fmt: skip
    return values


def with_backfill_l3_emptydir() -> dict[str, Any]:
    """Backfill with explicit jobs (DNS mode, no ScrapeConfig), the buffer in an emptyDir, L3."""
    values = two_sites(l3=True)
    values["gateway"]["backfill"] = {
        "enabled": True,
        "remoteWriteUrl": "https://prometheus.example.com/api/v1/write",
        "jobs": [
            {"port": 9400, "job": "dcgm", "instance": "{node}", "honorLabels": True,
             "labels": {"cluster": "edge"}},
            {"port": 9100, "job": "node", "discoveryLabels": False, "mode": "dns"},
            {"port": 9100, "job": "node-sd", "mode": "forward", "path": "/metrics"},
        ],
    }  # fmt: skip
    values["agent"]["backfill"] = {"enabled": True, "persistence": {"enabled": False}}
    return values


def with_backfill_authenticated() -> dict[str, Any]:
    """Backfill into an authenticated receiver (ACK's managed Prometheus: Basic auth with an
    AccessKey pair), with a CA of its own, a client certificate and a tenant header."""
    values = with_backfill()
    values["gateway"]["backfill"]["remoteWriteUrl"] = "https://rw.example.com/api/v1/write"
    values["gateway"]["backfill"]["receivers"] = "shared"
    values["gateway"]["backfill"]["maxRetryAfterSeconds"] = 120
    values["gateway"]["backfill"]["remoteWrite"] = {
        "secretName": "raven-remote-write",
        "basicAuth": {"username": "LTAI-access-key-id", "passwordKey": "password"},
        "tls": {"caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key",
                "serverName": "rw.example.com"},
        "headers": {"X-Scope-OrgID": "edge"},
    }  # fmt: skip
    return values


def documented_backfill_values() -> dict[str, Any]:
    """The ``values-kps.yaml`` block of docs/kubernetes.md with its ``backfill`` block."""
    values = documented_values()
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    block = text.split("<!-- values: backfill -->\n```yaml\n", 1)[1].split("```", 1)[0]
    for key, part in yaml.safe_load(block).items():
        values[key] = values.get(key, {}) | part
    return values


def behind_one_address() -> dict[str, Any]:
    """Agents outside the cluster: a LoadBalancer for every replica, WebSocket via an Ingress."""
    values = two_sites()
    values["gateway"] |= {
        "replicas": 3,
        "tunnelService": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.0/24"]},
        "websocket": {
            "enabled": True,
            "trustedProxies": ["10.244.0.0/16"],
            "ingress": {"enabled": True, "host": "raven.example.com", "tlsSecret": "raven-tls"},
        },
    }
    values["networkPolicy"] = {"enabled": True}
    return values


def with_gpu_exporter() -> dict[str, Any]:
    """The GPU exporter on cloud and edge GPU nodes, a PodMonitor for the cloud ones."""
    values = kube_prometheus_stack()
    values["gpuExporter"] = {"enabled": True, "cloud": {"podMonitor": {"enabled": True}}}
    return values


VARIANTS: dict[str, Callable[[], dict[str, Any]]] = {
    "behind-one-address": behind_one_address,
    "docs-kubernetes-md": documented_values,
    "docs-backfill": documented_backfill_values,
    "backfill-pvc": with_backfill,
    "backfill-emptydir-l3": with_backfill_l3_emptydir,
    "backfill-authenticated": with_backfill_authenticated,
    "no-sites": base_values,
    "two-sites-numeric-name": two_sites,
    "two-sites-l3": lambda: two_sites(l3=True),
    "kube-prometheus-stack": kube_prometheus_stack,
    "admin-token": with_admin_token,
    "gpu-exporter": with_gpu_exporter,
}
