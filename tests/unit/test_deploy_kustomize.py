"""deploy/kustomize: built, validated against the Kubernetes schemas, and checked for consistency.

The manifests are built by :func:`build`, a small kustomize written for these files: it
implements exactly the kustomization fields they use (``resources``, ``configMapGenerator``
with files and ``behavior``, ``generatorOptions`` with ``disableNameSuffixHash: true``,
``patches`` with strategic-merge files, ``nameSuffix`` with the name references we rely on,
``labels`` with ``includeSelectors``, ``images``) and fails on any other field. Where kubectl
with built-in kustomize is installed, a test checks that real kustomize builds the same objects.
Every object is then validated (kubernetes-validate, strict), and the Raven configs inside the
ConfigMaps are loaded with the real config classes, placeholders replaced by generated keys.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from raven.cli import build_parser
from raven.config import load_agent_config, load_gateway_config
from raven.config.common import parse_hostport
from tests.unit.test_deploy_common import (
    ROOT,
    check_workloads,
    container,
    fill_placeholders,
    find,
    kubectl,
    placeholder_keys,
    pod_spec,
    strategic_merge,
    validate_object,
)

KUSTOMIZE = ROOT / "deploy" / "kustomize"
BUILDS = ["base", "overlays/example", "overlays/l3", "gpu-exporter"]
SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "configMapGenerator",
    "generatorOptions",
    "patches",
    "nameSuffix",
    "labels",
    "images",
}
#: Kinds whose renaming (nameSuffix) is followed into the references below.
REFERENCED = {"ConfigMap", "ServiceAccount", "ClusterRole", "Role", "Secret"}


# --- a limited kustomize ------------------------------------------------------------------------


def build(path: Path) -> list[dict[str, Any]]:
    """Build the kustomization in ``path`` (the subset described in the module doc)."""
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
    options = k.get("generatorOptions", {})
    for gen in k.get("configMapGenerator", []):
        assert options.get("disableNameSuffixHash") is True, f"{path}: hashed names unsupported"
        _generate(path, gen, options, objs)
    for patch_entry in k.get("patches", []):
        assert set(patch_entry) == {"path"}, f"{path}: only file patches are supported"
        patch = yaml.safe_load((path / patch_entry["path"]).read_text(encoding="utf-8"))
        meta = patch["metadata"]
        matches = [
            i
            for i, o in enumerate(objs)
            if o["kind"] == patch["kind"]
            and o["metadata"]["name"] == meta["name"]
            and o["metadata"].get("namespace") == meta.get("namespace")
        ]
        assert len(matches) == 1, f"{path}: patch {patch['kind']}/{meta['name']} matches {matches}"
        objs[matches[0]] = strategic_merge(objs[matches[0]], patch)
    if "nameSuffix" in k:
        _add_suffix(objs, k["nameSuffix"])
    for label_set in k.get("labels", []):
        _add_labels(objs, label_set["pairs"], selectors=label_set.get("includeSelectors", False))
    for image in k.get("images", []):
        _set_image(objs, image)
    return objs


def _generate(
    path: Path, gen: dict[str, Any], options: dict[str, Any], objs: list[dict[str, Any]]
) -> None:
    data = {Path(f).name: (path / f).read_text(encoding="utf-8") for f in gen["files"]}
    name, namespace = gen["name"], gen.get("namespace")
    existing = [
        o
        for o in objs
        if o["kind"] == "ConfigMap"
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace") == namespace
    ]
    behavior = gen.get("behavior", "create")
    if behavior == "create":
        assert not existing, f"{path}: ConfigMap {name} exists already"
        meta: dict[str, Any] = {"name": name}
        if namespace:
            meta["namespace"] = namespace
        if options.get("labels"):
            meta["labels"] = dict(options["labels"])
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
        return
    assert len(existing) == 1, f"{path}: {behavior} of missing ConfigMap {name}"
    if behavior == "replace":
        existing[0]["data"] = data
    elif behavior == "merge":
        existing[0]["data"].update(data)
    else:
        raise AssertionError(f"{path}: unknown behavior {behavior}")


def _add_suffix(objs: list[dict[str, Any]], suffix: str) -> None:
    renamed: dict[tuple[str, str], str] = {}
    for o in objs:
        if o["kind"] == "Namespace":
            continue
        old = o["metadata"]["name"]
        o["metadata"]["name"] = old + suffix
        if o["kind"] in REFERENCED:
            renamed[(o["kind"], old)] = old + suffix
    for o in objs:
        if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}:
            spec = pod_spec(o)
            sa = spec.get("serviceAccountName")
            if sa:
                spec["serviceAccountName"] = renamed.get(("ServiceAccount", sa), sa)
            for v in spec.get("volumes", []):
                if "configMap" in v:
                    n = v["configMap"]["name"]
                    v["configMap"]["name"] = renamed.get(("ConfigMap", n), n)
                if "secret" in v:
                    n = v["secret"]["secretName"]
                    v["secret"]["secretName"] = renamed.get(("Secret", n), n)
        if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}:
            ref = o["roleRef"]
            ref["name"] = renamed.get((ref["kind"], ref["name"]), ref["name"])
            for s in o["subjects"]:
                s["name"] = renamed.get((s["kind"], s["name"]), s["name"])


def _add_labels(objs: list[dict[str, Any]], pairs: dict[str, str], *, selectors: bool) -> None:
    for o in objs:
        o["metadata"].setdefault("labels", {}).update(pairs)
        if not selectors:
            continue
        if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}:
            o["spec"]["selector"].setdefault("matchLabels", {}).update(pairs)
            o["spec"]["template"]["metadata"].setdefault("labels", {}).update(pairs)
        elif o["kind"] == "Service":
            o["spec"].setdefault("selector", {}).update(pairs)
        elif o["kind"] == "PodDisruptionBudget":
            o["spec"]["selector"].setdefault("matchLabels", {}).update(pairs)


def _set_image(objs: list[dict[str, Any]], image: dict[str, str]) -> None:
    for o in objs:
        if o["kind"] not in {"Deployment", "DaemonSet", "StatefulSet"}:
            continue
        spec = pod_spec(o)
        for c in spec.get("initContainers", []) + spec["containers"]:
            name, _, tag = c["image"].partition(":")
            if name == image["name"]:
                c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def key(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


@pytest.fixture(scope="module", params=BUILDS)
def built(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, build(KUSTOMIZE / request.param)


# --- schema validation ----------------------------------------------------------------------


def test_every_object_is_valid_for_kubernetes(built: tuple[str, list[dict[str, Any]]]) -> None:
    name, objs = built
    assert objs
    keys_seen = [key(o) for o in objs]
    assert len(keys_seen) == len(set(keys_seen)), f"{name}: duplicate objects"
    for o in objs:
        validate_object(o)


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


def test_real_kustomize_builds_the_same_objects_when_available() -> None:
    exe = kubectl()
    if exe is None:
        pytest.skip("kubectl with built-in kustomize is not installed (the limited build is used)")
    for name in BUILDS:
        out = subprocess.run(
            [exe, "kustomize", str(KUSTOMIZE / name)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        real = {key(o): o for o in yaml.safe_load_all(out) if o}
        ours = {key(o): o for o in build(KUSTOMIZE / name)}
        assert set(real) == set(ours), name
        for k, obj in ours.items():
            assert normalise(real[k]) == normalise(obj), f"{name}: {k} differs from kustomize's"


def normalise(value: Any) -> Any:
    """Order of named list items is not meaningful (kustomize puts patched items first)."""
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalise(v) for v in value]
        if items and all(isinstance(i, dict) and "name" in i for i in items):
            return sorted(items, key=lambda i: str(i["name"]))
        return items
    return value


# --- what the manifests say -----------------------------------------------------------------


def _config(objs: list[dict[str, Any]], cm_name: str, file: str, tmp: Path) -> Path:
    text = find(objs, "ConfigMap", cm_name)["data"][file]
    path = tmp / f"{cm_name}-{file}"
    path.write_text(fill_placeholders(text, placeholder_keys()), encoding="utf-8")
    return path


def _cli(args: list[str]) -> Any:
    return build_parser().parse_args(args)


@pytest.mark.parametrize("name", BUILDS)
def test_workload_security_probes_and_resources(name: str) -> None:
    check_workloads(build(KUSTOMIZE / name), l3=name == "overlays/l3")


@pytest.mark.parametrize("name", ["overlays/example", "overlays/l3"])
def test_configs_load_and_match_ports_services_and_mounts(name: str, tmp_path: Path) -> None:
    objs = build(KUSTOMIZE / name)
    gw_cfg = load_gateway_config(_config(objs, "raven-gateway-config", "gateway.yaml", tmp_path))
    agent_cfg = load_agent_config(
        _config(objs, "raven-agent-config-site-a", "agent.yaml", tmp_path)
    )

    gw = find(objs, "Deployment", "raven-gateway")
    assert gw["spec"]["replicas"] == 2
    gw_c = container(gw, "gateway")
    args = _cli(gw_c["args"])
    assert args.command == "gateway"
    mounts = {m["name"]: m["mountPath"] for m in gw_c["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["config"])
    assert Path(gw_cfg.private_key_file).parent == Path(mounts["keys"])
    ports = {p["name"]: p["containerPort"] for p in gw_c["ports"]}
    assert ports["tunnel"] == parse_hostport(gw_cfg.tunnel_listen)[1]
    assert ports["http-proxy"] == parse_hostport(gw_cfg.proxy.http_listen)[1]
    assert ports["admin"] == parse_hostport(gw_cfg.admin_listen)[1]
    tls = {parse_hostport(t.listen)[1]: t.target_port for t in gw_cfg.proxy.tls_listeners}
    assert tls == {ports["tls-proxy"]: 10250}
    config_vol = next(v for v in pod_spec(gw)["volumes"] if v["name"] == "config")
    assert config_vol["configMap"]["name"] == "raven-gateway-config"

    # Services: the headless one for agents, the ClusterIP one for Prometheus.
    tunnel = find(objs, "Service", "raven-gateway-tunnel")
    assert tunnel["spec"]["clusterIP"] == "None"
    proxy = find(objs, "Service", "raven-gateway")
    assert proxy["spec"]["type"] == "ClusterIP"
    for svc in (tunnel, proxy):
        selector = svc["spec"]["selector"]
        assert selector.items() <= gw["spec"]["template"]["metadata"]["labels"].items()
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"{svc['metadata']['name']}: {p['targetPort']}"
    by_port = {p["port"]: p["targetPort"] for p in proxy["spec"]["ports"]}
    for scraped in agent_cfg.allowed_ports:
        if scraped == 10250:
            assert by_port[scraped] == "tls-proxy"
        elif scraped != 10266:  # the agent's own admin port is scraped through the proxy port
            assert by_port[scraped] == "http-proxy", scraped
    assert by_port[ports["http-proxy"]] == "http-proxy"
    assert {p["port"]: p["targetPort"] for p in tunnel["spec"]["ports"]}[ports["tunnel"]] == (
        "tunnel"
    )

    # The agent: the headless Service's DNS name, pinned to the site's gateway nodes.
    host, port = parse_hostport(agent_cfg.gateway)
    ns = tunnel["metadata"]["namespace"]
    assert host == f"raven-gateway-tunnel.{ns}.svc.cluster.local" and port == ports["tunnel"]
    agent = find(objs, "Deployment", "raven-agent-site-a")
    spec = pod_spec(agent)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["nodeSelector"] == {"raven.io/edge-gateway": "true", "raven.io/site": "site-a"}
    assert agent_cfg.kubernetes.enabled and agent_cfg.kubernetes.label_selector == (
        "raven.io/site=site-a"
    )
    a_c = container(agent, "agent")
    a_args = _cli(a_c["args"])
    a_mounts = {m["name"]: m["mountPath"] for m in a_c["volumeMounts"]}
    assert Path(a_args.config).parent == Path(a_mounts["config"])
    assert Path(agent_cfg.private_key_file).parent == Path(a_mounts["keys"])
    admin = parse_hostport(agent_cfg.admin_listen)[1]
    assert a_c["livenessProbe"]["httpGet"]["port"] == admin
    assert a_c["readinessProbe"]["httpGet"]["port"] == admin
    assert admin in agent_cfg.allowed_ports
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["config"]["configMap"]["name"] == "raven-agent-config-site-a"
    assert vols["key-secret"]["secret"]["secretName"] == "raven-agent-key-site-a"
    assert spec["serviceAccountName"] == "raven-agent-site-a"
    binding = find(objs, "ClusterRoleBinding", "raven-agent-site-a")
    assert binding["roleRef"]["name"] == "raven-agent-site-a"
    assert binding["subjects"][0]["name"] == "raven-agent-site-a"
    role = find(objs, "ClusterRole", "raven-agent-site-a")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]

    # The gateway authorises the site's agent (by key, in production) for its node names.
    (site,) = [a for a in gw_cfg.agents if a.name == agent_cfg.name]
    assert site.may_serve("site-a-gpu-1") and not site.may_serve("site-b-gpu-1")
    if name == "overlays/l3":
        assert gw_cfg.tun.enabled and agent_cfg.tun.enabled
        assert set(agent_cfg.subnets) <= set(site.prefixes)
    else:
        assert not gw_cfg.tun.enabled and not agent_cfg.tun.enabled


def test_hosts_generator_rbac_and_arguments_fit_together() -> None:
    objs = build(KUSTOMIZE / "base")
    dep = find(objs, "Deployment", "raven-coredns-hosts")
    c = container(dep, "coredns-hosts")
    args = _cli(c["args"])
    assert (args.command, args.hosts_action, args.source) == ("coredns-hosts", "run", "kubernetes")
    proxy = find(objs, "Service", "raven-gateway")
    assert args.service == f"{proxy['metadata']['namespace']}/{proxy['metadata']['name']}"
    cm_ns, cm_name = args.configmap.split("/")
    assert (cm_ns, cm_name, args.configmap_key) == (
        "kube-system",
        "edge-tunnel-nodes",
        "tunnel-nodes",
    )
    admin = parse_hostport(args.admin_listen)[1]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"admin": admin}

    sa = pod_spec(dep)["serviceAccountName"]
    assert find(objs, "ServiceAccount", sa)["metadata"]["namespace"] == "raven-system"
    cluster_role = find(objs, "ClusterRole", "raven-coredns-hosts")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "services"], "verbs": ["get", "list", "watch"]}
    ]
    role = find(objs, "Role", "raven-coredns-hosts")
    assert role["metadata"]["namespace"] == cm_ns
    named = next(r for r in role["rules"] if "resourceNames" in r)
    assert named["resourceNames"] == [cm_name] and set(named["verbs"]) == {"get", "update", "patch"}
    unnamed = next(r for r in role["rules"] if "resourceNames" not in r)
    assert unnamed["verbs"] == ["create"] and unnamed["resources"] == ["configmaps"]
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        b = find(objs, kind, "raven-coredns-hosts")
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": "raven-coredns-hosts",
        }
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": "raven-system"}
        ]
    patch = yaml.safe_load((KUSTOMIZE / "coredns" / "deployment-patch.yaml").read_text())
    (vol,) = pod_spec(patch)["volumes"]
    assert vol["configMap"]["name"] == cm_name
    assert vol["configMap"]["items"][0]["key"] == args.configmap_key


@pytest.mark.parametrize("name", ["base", "overlays/example", "overlays/l3"])
def test_service_monitors_select_a_service_port(name: str) -> None:
    objs = build(KUSTOMIZE / name)
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"raven-gateway", "raven-coredns-hosts"}
    services = [o for o in objs if o["kind"] == "Service"]
    for m in monitors:
        wanted = m["spec"]["selector"]["matchLabels"].items()
        selected = [s for s in services if wanted <= s["metadata"].get("labels", {}).items()]
        assert len(selected) == 1, f"{m['metadata']['name']} selects {len(selected)} Services"
        port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
        for endpoint in m["spec"]["endpoints"]:
            assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"


def test_images_are_set_for_every_container() -> None:
    for name in ("overlays/example", "overlays/l3"):
        for o in build(KUSTOMIZE / name):
            if o["kind"] == "Deployment":
                spec = pod_spec(o)
                for c in spec.get("initContainers", []) + spec["containers"]:
                    assert c["image"] == "registry.example.com/raven:0.1.0", (name, c["name"])


def test_the_limited_build_refuses_unknown_kustomization_fields(tmp_path: Path) -> None:
    k = copy.deepcopy(yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text()))
    k["namePrefix"] = "x-"
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with pytest.raises(AssertionError, match="namePrefix"):
        build(tmp_path)


#: kubeadm's CoreDNS Deployment (v1.30), the object the CoreDNS patch is applied to.
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
    from raven.cli import build_parser

    (ds,) = [o for o in build(KUSTOMIZE / "gpu-exporter") if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    (container,) = spec["containers"]
    assert container["ports"][0]["containerPort"] == 9400
    args = build_parser().parse_args(container["args"])
    assert args.kubernetes is True
    assert {e["name"] for e in container["env"]} >= {"NODE_NAME", "NVIDIA_VISIBLE_DEVICES"}
