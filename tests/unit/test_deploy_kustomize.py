"""deploy/kustomize: generated from the Helm chart (one source), built, validated.

``base``, ``overlays/example`` and ``overlays/l3`` hold a ``values.yaml`` and the ``raven.yaml``
that scripts/gen_manifests.py renders from the chart with it (real Helm); coredns-hosts/deploy's
rbac.yaml and deployment.yaml are the hosts generator's objects of the base rendering. The drift
test fails when any generated file differs from a fresh rendering. Builds use the kustomization
fields these folders use (``resources``, ``images``: :func:`build` refuses any other), then
every object is validated (kubernetes-validate strict, CRD schemas) and every workload checked
(security contexts, probes, resources; Pod Security "restricted" except the L3 variant's two).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from coredns_hosts.sources.kubernetes import DEFAULT_SERVICE

from tests.helpers import load_script
from tests.helpers.deploy import (
    ROOT,
    check_workloads,
    container,
    find,
    is_l3_container,
    pod_security_violations,
    pod_spec,
    strategic_merge,
    validate_object,
    workloads,
)

KUSTOMIZE = ROOT / "deploy" / "kustomize"
BUILDS = ["base", "overlays/example", "overlays/l3", "gpu-exporter"]
SUPPORTED = {"apiVersion", "kind", "resources", "images"}


def gen_manifests() -> ModuleType:
    return load_script(ROOT / "scripts/gen_manifests.py")


def build(path: Path) -> list[dict[str, Any]]:
    """Build the kustomization in ``path`` (``resources`` and ``images`` only)."""
    k = yaml.safe_load((path / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(k) - SUPPORTED
    assert not unknown, f"{path}: kustomization fields this test does not implement: {unknown}"
    objs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        target = (path / entry).resolve()
        if target.is_dir():
            objs.extend(build(target))
        else:
            objs.extend(d for d in yaml.safe_load_all(target.read_text(encoding="utf-8")) if d)
    for image in k.get("images", []):
        for w in workloads(objs):
            for c in pod_spec(w).get("initContainers", []) + pod_spec(w)["containers"]:
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return objs


def key(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


def test_generated_manifests_are_what_the_chart_renders() -> None:
    """The drift test: every generated file equals a fresh rendering of the chart."""
    for path, text in gen_manifests().generated().items():
        rel = path.relative_to(ROOT)
        assert path.read_text() == text, (
            f"{rel} drifted from the chart: run scripts/gen_manifests.py"
        )


def test_gen_manifests_check_mode_reports_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = gen_manifests()
    assert module.main(["--check"]) == 0
    files = module.generated()
    victim = next(iter(files))
    monkeypatch.setattr(module, "generated", lambda: {**files, victim: files[victim] + "# edit\n"})
    assert module.main(["--check"]) == 1


@pytest.mark.parametrize("name", BUILDS)
def test_every_object_is_valid_and_every_workload_follows_the_rules(name: str) -> None:
    objs = build(KUSTOMIZE / name)
    assert objs
    keys_seen = [key(o) for o in objs]
    assert len(keys_seen) == len(set(keys_seen)), f"{name}: duplicate objects"
    for o in objs:
        validate_object(o)
    l3 = name == "overlays/l3"
    check_workloads(objs, l3=l3)
    for w in workloads(objs):
        found = pod_security_violations(pod_spec(w))
        l3_pod = any(is_l3_container(c) for c in pod_spec(w)["containers"])
        root_by_design = l3_pod or w["metadata"]["name"] == "raven-gpu-exporter"
        assert not l3_pod or l3
        assert bool(found) == root_by_design, (w["metadata"]["name"], found)


def test_the_example_runs_one_site_and_the_hosts_generator_names_the_real_service() -> None:
    objs = build(KUSTOMIZE / "overlays/example")
    agent = find(objs, "Deployment", "raven-agent-site-a")
    assert pod_spec(agent)["nodeSelector"]["raven.io/site"] == "site-a"
    args = container(find(objs, "Deployment", "raven-coredns-hosts"), "coredns-hosts")["args"]
    service = next(a.split("=", 1)[1] for a in args if a.startswith("--service="))
    namespace, name = service.split("/")
    assert find(objs, "Service", name)["metadata"]["namespace"] == namespace
    assert service == DEFAULT_SERVICE, "the CLI's default names the Service the chart creates"


def test_coredns_files_are_valid_and_the_patch_applies() -> None:
    stock = STOCK_COREDNS_DEPLOYMENT
    validate_object(stock)
    patch = yaml.safe_load((KUSTOMIZE / "coredns" / "deployment-patch.yaml").read_text())
    patched = strategic_merge(stock, patch)
    validate_object(patched)
    c = container(patched, "coredns")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "edge-tunnel-nodes")
    assert mount == {"name": "edge-tunnel-nodes", "mountPath": "/etc/edge", "readOnly": True}
    assert {m["name"] for m in c["volumeMounts"]} == {"config-volume", "edge-tunnel-nodes"}
    vol = next(v for v in pod_spec(patched)["volumes"] if v["name"] == "edge-tunnel-nodes")
    assert vol["configMap"]["name"] == "edge-tunnel-nodes"
    assert vol["configMap"]["items"] == [{"key": "tunnel-nodes", "path": "tunnel-nodes"}]
    cm = yaml.safe_load((KUSTOMIZE / "coredns" / "edge-tunnel-nodes.yaml").read_text())
    validate_object(cm)
    assert cm["metadata"] == {
        "name": "edge-tunnel-nodes",
        "namespace": "kube-system",
        "labels": {"app.kubernetes.io/part-of": "raven"},
    }
    assert "tunnel-nodes" in cm["data"]
    corefile = (KUSTOMIZE / "coredns" / "Corefile.example").read_text()
    block = "    hosts /etc/edge/tunnel-nodes {\n        reload 300ms\n        fallthrough\n    }\n"
    assert block in corefile
    assert (
        corefile.index(block) < corefile.index("    kubernetes ") < corefile.index("    forward .")
    )
    assert f"{mount['mountPath']}/{vol['configMap']['items'][0]['path']}" in block


STOCK_COREDNS_DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "coredns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
        "template": {
            "metadata": {"labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "priorityClassName": "system-cluster-critical",
                "serviceAccountName": "coredns",
                "containers": [
                    {
                        "name": "coredns",
                        "image": "registry.k8s.io/coredns/coredns:v1.11.1",
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "volumeMounts": [
                            {"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}
                        ],
                        "ports": [
                            {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                            {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                            {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
                        ],
                    }
                ],
                "dnsPolicy": "Default",
                "volumes": [
                    {
                        "name": "config-volume",
                        "configMap": {
                            "name": "coredns",
                            "items": [{"key": "Corefile", "path": "Corefile"}],
                        },
                    }
                ],
            },
        },
    },
}


def test_hosts_generator_manifests_shipped_with_it_are_valid_and_agree() -> None:
    """coredns-hosts/deploy/ (the generator's own copy) and deploy/kustomize/ say the same."""
    own = ROOT / "coredns-hosts" / "deploy"
    for name in ("deployment.yaml", "rbac.yaml"):
        for obj in yaml.safe_load_all((own / name).read_text()):
            if obj:
                validate_object(obj)
    ours = pod_spec(yaml.safe_load((KUSTOMIZE / "coredns" / "deployment-patch.yaml").read_text()))
    theirs = pod_spec(yaml.safe_load((own / "coredns-patch.yaml").read_text()))
    validate_object(
        strategic_merge(STOCK_COREDNS_DEPLOYMENT, {"spec": {"template": {"spec": theirs}}})
    )
    (our_vol,), (their_vol,) = ours["volumes"], theirs["volumes"]
    assert our_vol["configMap"]["name"] == their_vol["configMap"]["name"]
    our_mount = ours["containers"][0]["volumeMounts"][0]["mountPath"]
    their_mount = theirs["containers"][0]["volumeMounts"][0]["mountPath"]
    assert our_mount == their_mount
    snippet = (own / "Corefile.snippet").read_text()
    corefile = (KUSTOMIZE / "coredns" / "Corefile.example").read_text()
    block = re.search(r"^hosts .*?^\}", snippet, re.M | re.S)
    assert block is not None
    indented = "\n".join("    " + line for line in block.group(0).splitlines())
    assert indented in corefile


def test_gpu_exporter_daemonset_serves_the_node_port_with_the_real_cli() -> None:
    """Scraped as <node>:9400 like dcgm-exporter: host network, port 9400, args the CLI accepts."""
    from raven_cli.main import build_parser

    (ds,) = [o for o in build(KUSTOMIZE / "gpu-exporter") if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    (container,) = spec["containers"]
    assert container["ports"][0]["containerPort"] == 9400
    args = build_parser().parse_args(container["args"])
    assert args.kubernetes is True
    assert {e["name"] for e in container["env"]} >= {"NODE_NAME", "NVIDIA_VISIBLE_DEVICES"}


def test_prometheus_adapter_files_are_valid_and_do_not_collide_with_kube_prometheus() -> None:
    adapter = ROOT / "deploy" / "prometheus-adapter"
    (rules,) = [
        d for d in yaml.safe_load_all((adapter / "gpu-adapter-rules.yaml").read_text()) if d
    ]
    validate_object(rules)
    assert rules["metadata"]["name"] != "adapter-config", "kube-prometheus's ConfigMap name"
    for rule in yaml.safe_load(rules["data"]["config.yaml"])["rules"]:
        assert set(rule) <= {"seriesQuery", "resources", "name", "metricsQuery"}, rule
    (hpa,) = [d for d in yaml.safe_load_all((adapter / "hpa-gpu-example.yaml").read_text()) if d]
    validate_object(hpa)
