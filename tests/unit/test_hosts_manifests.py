"""The shipped Corefile snippet, CoreDNS patch, RBAC and Deployment agree with the code (the RBAC
and Deployment are generated from the Helm chart: tests/unit/test_deploy_kustomize.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from coredns_hosts.sinks.configmap import DEFAULT_KEY, DEFAULT_NAME, DEFAULT_NAMESPACE
from coredns_hosts.sources.kubernetes import DEFAULT_NODE_SELECTOR, DEFAULT_SERVICE
from coredns_hosts.sources.static import parse_static

DEPLOY = Path(__file__).resolve().parents[2] / "coredns-hosts" / "deploy"


def load_all(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_corefile_snippet_reads_the_mounted_configmap_key() -> None:
    snippet = (DEPLOY / "Corefile.snippet").read_text()
    match = re.search(r"^hosts (\S+) \{\s*reload 300ms\s*fallthrough\s*\}", snippet, re.M)
    assert match is not None
    hosts_path = Path(match.group(1))
    (patch,) = load_all("coredns-patch.yaml")
    spec = patch["spec"]["template"]["spec"]
    (mount,) = spec["containers"][0]["volumeMounts"]
    (volume,) = spec["volumes"]
    assert mount["name"] == volume["name"] and "subPath" not in mount
    assert volume["configMap"]["name"] == DEFAULT_NAME
    (item,) = volume["configMap"]["items"]
    assert item["key"] == DEFAULT_KEY
    assert Path(mount["mountPath"]) / item["path"] == hosts_path == Path("/etc/edge/tunnel-nodes")
    assert patch["metadata"]["namespace"] == DEFAULT_NAMESPACE


def test_rbac_covers_every_call_and_no_more() -> None:
    docs = {d["kind"]: d for d in load_all("rbac.yaml")}
    cluster = {
        (r, v)
        for rule in docs["ClusterRole"]["rules"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert {
        ("nodes", "list"),
        ("nodes", "watch"),
        ("services", "list"),
        ("services", "watch"),
    } <= cluster
    assert all(r in ("nodes", "services") for r, _ in cluster)
    role = docs["Role"]
    assert role["metadata"]["namespace"] == DEFAULT_NAMESPACE
    granted = set()
    for rule in role["rules"]:
        assert rule["resources"] == ["configmaps"]
        assert rule.get("resourceNames", [DEFAULT_NAME]) == [DEFAULT_NAME]
        granted |= set(rule["verbs"])
    assert granted == {"get", "update", "create"}  # read, replace (PUT), create
    sa = docs["ServiceAccount"]["metadata"]
    (dep,) = [d for d in load_all("deployment.yaml") if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["name"]
    args = pod["containers"][0]["args"]
    assert f"--node-selector={DEFAULT_NODE_SELECTOR}" in args
    assert f"--service={DEFAULT_SERVICE}" in args
    assert f"--configmap={DEFAULT_NAMESPACE}/{DEFAULT_NAME}" in args


def test_static_example_parses() -> None:
    snap = parse_static((DEPLOY / "static-nodes.example.yaml").read_text(), [], "example")
    assert [e.name for e in snap.entries] == ["edge-gpu-1", "edge-gpu-2", "edge-gpu-3"]
