"""deploy/helm/raven: rendered by real Helm over a matrix of values, every object validated
strictly (Kubernetes schemas, Prometheus Operator CRD schemas), every pod checked against Pod
Security "restricted", the Raven configs loaded with the real config classes.

Helm is Helm's own Go SDK (v4) from PyPI: ``helm-python-sdk`` (import ``helm_python``, a ctypes
binding to ``libhelm_c`` shipped in the wheel; the test extras install it). Rendering is what
``helm template`` does: values merged over values.yaml, checked against values.schema.json,
every template run by Go's text/template with Sprig.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from raven.config.agent import load_agent_config
from raven.config.common import parse_hostport
from raven.config.gateway import load_gateway_config
from raven_cli.main import build_parser
from tests.helpers.chart import (
    APP_VERSION,
    CHART,
    KPS_LABELS,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    base_values,
    behind_one_address,
    kube_prometheus_stack,
    render,
    two_sites,
    with_admin_token,
    with_gpu_exporter,
)
from tests.helpers.deploy import (
    ROOT,
    check_workloads,
    container,
    find,
    is_l3_container,
    pod_security_violations,
    pod_spec,
    validate_object,
    workloads,
)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    values = VARIANTS[request.param]()
    return request.param, values, render(values)


def ident(o: dict[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


# --- every variant ----------------------------------------------------------------------------


def test_every_rendered_object_is_valid(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    name, _values, objs = variant
    ids = [ident(o) for o in objs]
    assert len(ids) == len(set(ids)), name
    for o in objs:
        validate_object(o)
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE, ident(o)
        assert labels["app.kubernetes.io/version"] == APP_VERSION, ident(o)


def test_pod_security_restricted_except_the_l3_containers(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Every pod passes Pod Security "restricted" except the L3 gateway and agents (NET_ADMIN,
    /dev/net/tun; the agents on the host network): the documented exception."""
    name, values, objs = variant
    check_workloads(objs, l3=values.get("l3", {}).get("enabled", False))
    privileged = gpu_exporter_namespace(values, objs)
    for w in workloads(objs):
        spec = pod_spec(w)
        if w["metadata"]["namespace"] == privileged:  # the GPU exporter's own namespace
            continue
        found = pod_security_violations(spec)
        if any(is_l3_container(c) for c in spec["containers"]):
            assert values["l3"]["enabled"], w["metadata"]["name"]
            assert found, f"{name}: an L3 pod cannot pass restricted"
        else:
            assert found == [], (name, w["metadata"]["name"], found)
        images = {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
        repository = values.get("image", {}).get("repository", "raven")
        assert images == {f"{repository}:{APP_VERSION}"}, "image tag defaults to the appVersion"


def gpu_exporter_namespace(values: dict[str, Any], objs: list[dict[str, Any]]) -> str | None:
    """The GPU exporter's namespace, labelled Pod Security "privileged" (hostPID,
    hostNetwork, a hostPath, uid 0), never the release's ("restricted")."""
    gpu = values.get("gpuExporter", {})
    if not gpu.get("enabled"):
        assert not [w for w in workloads(objs) if "gpu-exporter" in w["metadata"]["name"]]
        return None
    namespace = str(gpu.get("namespace", "raven-gpu-exporter"))
    assert namespace != NAMESPACE
    ns = find(objs, "Namespace", namespace)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    return namespace


def test_configs_load_and_agree_with_the_objects(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    _name, values, objs = variant
    sites = values.get("sites", [])
    l3 = values.get("l3", {}).get("enabled", False)
    gw_path = tmp_path / "gateway.yaml"
    gw_path.write_text(find(objs, "ConfigMap", "raven-gateway-config")["data"]["gateway.yaml"])
    gw_cfg = load_gateway_config(gw_path)
    assert [a.name for a in gw_cfg.agents] == [s["name"] for s in sites]
    assert gw_cfg.tun.enabled == l3
    token = values.get("adminToken", {}).get("existingSecret")
    assert gw_cfg.admin_token_file == ("/run/raven/keys/admin.token" if token else None)

    gw = find(objs, "Deployment", "raven-gateway")
    annotations = gw["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(k.startswith("checksum/") for k in annotations), "sites reload live"
    ports = {p["name"]: p["containerPort"] for p in container(gw, "gateway")["ports"]}
    assert ports["tunnel"] == parse_hostport(gw_cfg.tunnel_listen)[1]
    assert ports["http-proxy"] == parse_hostport(gw_cfg.proxy.http_listen)[1]
    assert ports["admin"] == parse_hostport(gw_cfg.admin_listen)[1]
    (tls,) = gw_cfg.proxy.tls_listeners
    proxy = find(objs, "Service", "raven-gateway")
    by_port = {p["port"]: p["targetPort"] for p in proxy["spec"]["ports"]}
    assert by_port[tls.target_port] == "tls-proxy"
    assert find(objs, "Service", "raven-gateway-tunnel")["spec"]["clusterIP"] == "None"
    secret_volume = next(v for v in pod_spec(gw)["volumes"] if v["name"] == "key-secret")
    assert secret_volume["secret"]["secretName"] == values["gateway"]["existingSecret"]
    assert not [o for o in objs if o["kind"] == "Secret"], "keys never go through values"

    for s in sites:
        cm = find(objs, "ConfigMap", f"raven-agent-config-{s['name']}")
        path = tmp_path / f"{s['name']}.yaml"
        path.write_text(cm["data"]["agent.yaml"])
        cfg = load_agent_config(path)
        assert cfg.name == s["name"]
        assert (
            cfg.gateway == f"raven-gateway-tunnel.{NAMESPACE}.svc.cluster.local:{ports['tunnel']}"
        )
        assert cfg.gateway_public_key == values["gateway"]["publicKey"]
        assert cfg.kubernetes.label_selector == f"raven.io/site={s['name']}"
        assert cfg.kubernetes.services == values.get("agent", {}).get("services", [])
        assert cfg.allowed_ports == s.get("allowedPorts", [9400, 9100, 10250, 10255])
        assert cfg.tun.enabled == l3
        token = values.get("adminToken", {}).get("existingSecret")
        assert cfg.admin_token_file == ("/run/raven/keys/admin.token" if token else None)
        extra = values.get("agent", {}).get("extraConfig", {})
        assert cfg.reconnect.max_backoff_s == extra.get("reconnect", {}).get("max_backoff_s", 30.0)
        (authorised,) = [a for a in gw_cfg.agents if a.name == s["name"]]
        assert authorised.public_key == s["publicKey"]
        dep = find(objs, "Deployment", f"raven-agent-{s['name']}")
        spec = pod_spec(dep)
        assert spec.get("hostNetwork", False) == l3
        assert spec["nodeSelector"] == {"raven.io/edge-gateway": "true", "raven.io/site": s["name"]}
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        assert vols["key-secret"]["secret"]["secretName"] == s["existingSecret"]
        assert build_parser().parse_args(container(dep, "agent")["args"]).command == "agent"


def test_hosts_generator_arguments_and_rbac(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _name, _values, objs = variant
    dep = find(objs, "Deployment", "raven-coredns-hosts")
    args = build_parser().parse_args(container(dep, "coredns-hosts")["args"])
    namespace, service = args.service.split("/")
    assert find(objs, "Service", service)["metadata"]["namespace"] == namespace
    assert args.configmap == "kube-system/edge-tunnel-nodes"
    role = find(objs, "Role", "raven-coredns-hosts")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"][0]["resourceNames"] == ["edge-tunnel-nodes"]
    cluster_role = find(objs, "ClusterRole", "raven-coredns-hosts")
    assert cluster_role["rules"][0]["resources"] == ["nodes", "services"]
    assert set(cluster_role["rules"][0]["verbs"]) == {"get", "list", "watch"}


def test_network_policies_name_real_ports(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Only the tunnel port is open to all; each policy selects pods that exist and names
    container ports they have."""
    _name, values, objs = variant
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} >= {"raven-gateway", "raven-coredns-hosts"}
    for policy in policies:
        selector = policy["spec"]["podSelector"]["matchLabels"]
        pods = [
            w for w in workloads(objs)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert pods, policy["metadata"]["name"]
        names = {p["name"] for w in pods for c in pod_spec(w)["containers"] for p in c["ports"]}
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= names
            if "from" not in rule:  # open to anyone: the tunnel ports only
                assert {p["port"] for p in rule["ports"]} <= {"tunnel", "websocket"}
    if values.get("sites") and not values.get("l3", {}).get("enabled"):
        agents = find(objs, "NetworkPolicy", "raven-agents")
        (rule,) = agents["spec"]["ingress"]
        assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == (
            "raven-gateway"
        )


# --- kube-prometheus-stack, switches ------------------------------------------------------------


def test_kube_prometheus_stack_objects_carry_its_labels_and_select_real_ports() -> None:
    values = kube_prometheus_stack()
    objs = render(values)
    monitoring = [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    kinds = sorted(o["kind"] for o in monitoring)
    assert kinds == ["PodMonitor", "PrometheusRule", "ScrapeConfig", "ScrapeConfig",
                     "ServiceMonitor", "ServiceMonitor"]  # fmt: skip
    for o in monitoring:
        assert o["metadata"]["namespace"] == "monitoring"
        assert KPS_LABELS.items() <= o["metadata"]["labels"].items(), ident(o)
        assert o["metadata"]["labels"]["team"] == "gpu-platform"
    for sm in (o for o in monitoring if o["kind"] == "ServiceMonitor"):
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        services = [
            s for s in objs
            if s["kind"] == "Service"
            and sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]  # fmt: skip
        assert services, sm["metadata"]["name"]
        for endpoint in sm["spec"]["endpoints"]:
            assert all(
                endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in services
            )
    scrape = {o["metadata"]["name"]: o for o in monitoring if o["kind"] == "ScrapeConfig"}
    edge = scrape["raven-edge-9400"]["spec"]
    assert edge["httpSDConfigs"][0]["url"] == (
        f"http://raven-gateway.{NAMESPACE}.svc:10265/api/v1/targets?port=9400"
    )
    assert edge["proxyUrl"] == f"http://raven-gateway.{NAMESPACE}.svc:10264"
    assert {"sourceLabels": ["__address__"], "targetLabel": "instance"} in edge["relabelings"]
    dashboards = [o for o in objs if o["kind"] == "ConfigMap" and "grafana_dashboard" in
                  o["metadata"]["labels"]]  # fmt: skip
    shipped = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(k for d in dashboards for k in d["data"]) == shipped
    for d in dashboards:
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        for file, text in d["data"].items():
            assert json.loads(text) == json.loads((CHART / "dashboards" / file).read_text())
    pull = pod_spec(find(objs, "Deployment", "raven-gateway"))["imagePullSecrets"]
    assert pull == [{"name": "global-cred"}, {"name": "regcred"}, {"name": "other"}]
    (role,) = [
        o for o in objs if o["kind"] == "Role" and o["metadata"]["namespace"] == "gpu-operator"
    ]
    assert {r["apiGroups"][0]: r["resources"] for r in role["rules"]} == {
        "": ["services"],
        "discovery.k8s.io": ["endpointslices"],
    }
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in role["rules"])


def test_monitoring_is_off_by_default() -> None:
    objs = render(two_sites())
    assert not [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not [o for o in objs if "grafana_dashboard" in o["metadata"]["labels"]]


def test_names_overrides_and_gateway_address() -> None:
    values = two_sites() | {"fullnameOverride": "edge"}
    values["agent"]["gateway"] = "tunnel.example.com:443"
    objs = render(values)
    names = {o["metadata"]["name"] for o in objs}
    assert {"edge-gateway", "edge-gateway-tunnel", "edge-agent-site-a"} <= names
    assert not any(n.startswith("raven-") for n in names)
    cfg = yaml.safe_load(find(objs, "ConfigMap", "edge-agent-config-site-a")["data"]["agent.yaml"])
    assert cfg["gateway"] == "tunnel.example.com:443"
    other = render(base_values(), release="prod")
    assert "prod-raven-gateway" in {o["metadata"]["name"] for o in other}
    named = render(base_values() | {"nameOverride": "tunnel"}, release="prod")
    gw = find(named, "Deployment", "prod-tunnel-gateway")
    assert gw["metadata"]["labels"]["app.kubernetes.io/name"] == "tunnel-gateway"


def test_values_schema_rejects_typos_and_allows_standard_keys() -> None:
    render(kube_prometheus_stack())  # global, imagePullSecrets, commonLabels... accepted
    broken: list[Callable[[dict[str, Any]], None]] = [
        lambda v: v["sites"][0].update(publickey=v["sites"][0].pop("publicKey")),
        lambda v: v["serviceMonitor"].update(additionalLabel={"a": "b"}),
        lambda v: v.update(imagePullSecret=["x"]),
        lambda v: v["sites"][0].update(name="Site_A"),
        lambda v: v["sites"][0].update(name=123),  # unquoted in a values file: a number
        lambda v: v["gateway"].update(privateKey="never in values"),
    ]
    for breaks in broken:
        values = kube_prometheus_stack()
        breaks(values)
        with pytest.raises(helm.HelmValuesError):
            render(values)


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (lambda v: v["gateway"].pop("existingSecret"), r"gateway\.existingSecret is required"),
        (lambda v: v["gateway"].update(publicKey=""), r"gateway\.publicKey is required"),
        (lambda v: v["sites"][0].pop("existingSecret"), r"sites\[site-a\]\.existingSecret"),
        (lambda v: v["sites"][0].pop("tunAddress"), "tunAddress"),
    ],
)
def test_required_values_fail_the_render(
    breaks: Callable[[dict[str, Any]], None], message: str
) -> None:
    values = two_sites(l3=True)
    breaks(values)
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_helm_lint_strict_finds_nothing() -> None:
    for make in VARIANTS.values():
        report = helm.lint(str(CHART), make(), strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert problems == [] and report["errors"] == [], report


def test_chart_dashboards_are_the_deploy_grafana_ones() -> None:
    for path in (CHART / "dashboards").glob("*.json"):
        assert path.read_bytes() == (ROOT / "deploy" / "grafana" / path.name).read_bytes()


def test_numeric_site_name_stays_a_string_everywhere() -> None:
    values = two_sites()
    objs = render(values)
    dep = find(objs, "Deployment", "raven-agent-123")
    assert dep["metadata"]["labels"]["raven.io/site"] == "123"
    assert pod_spec(dep)["nodeSelector"]["raven.io/site"] == "123"
    text = find(objs, "ConfigMap", "raven-agent-config-123")["data"]["agent.yaml"]
    assert re.search(r'^name: "123"$', text, re.M)


def test_admin_token_reaches_the_processes_and_the_http_sd_scrape() -> None:
    objs = render(with_admin_token())
    for name in ("raven-gateway", "raven-agent-site-a"):
        volume = next(v for v in pod_spec(find(objs, "Deployment", name))["volumes"]
                      if v["name"] == "admin-token")  # fmt: skip
        assert volume["secret"] == {
            "secretName": "raven-admin-token",
            "defaultMode": 0o440,
            "items": [{"key": "token", "path": "admin.token"}],
        }
    scrape = find(objs, "ScrapeConfig", "raven-edge-9400")
    (sd,) = scrape["spec"]["httpSDConfigs"]
    assert sd["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "raven-admin-token", "key": "token"},
    }


def test_replicas_behind_one_address_drain_in_order_and_websocket_ingress() -> None:
    """The chart's defaults match the shutdown sequence (not ready at once, serve for the
    delay, drain, exit within the grace period) and the replica count agents are told."""
    objs = render(behind_one_address())
    by = {ident(o): o for o in objs}
    deploy = by[("Deployment", NAMESPACE, f"{RELEASE}-gateway")]
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    probe = container["readinessProbe"]
    cfg_map = by[("ConfigMap", NAMESPACE, f"{RELEASE}-gateway-config")]
    cfg = yaml.safe_load(cfg_map["data"]["gateway.yaml"])
    assert cfg["replica"] == {"count": 3}
    delay, drain = cfg["shutdown_delay_s"], cfg["limits"]["drain_timeout_s"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < delay
    assert pod["terminationGracePeriodSeconds"] >= delay + drain + 5
    assert cfg["ready_after_s"] > 0
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )
    assert cfg["websocket"]["listen"].endswith(":10268")
    lb = by[("Service", NAMESPACE, f"{RELEASE}-gateway-tunnel-lb")]
    assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["publishNotReadyAddresses"]
    assert {p["name"] for p in lb["spec"]["ports"]} == {"tunnel", "websocket"}
    headless = by[("Service", NAMESPACE, f"{RELEASE}-gateway-tunnel")]
    assert headless["spec"]["publishNotReadyAddresses"]
    ingress = by[("Ingress", NAMESPACE, f"{RELEASE}-gateway-websocket")]
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    (rule,) = ingress["spec"]["rules"]
    assert rule["http"]["paths"][0]["path"] == cfg["websocket"]["path"]


def test_gpu_exporter_cloud_and_edge_and_only_cloud_scraped_directly() -> None:
    objs = render(with_gpu_exporter())
    cloud, edge = (find(objs, "DaemonSet", f"raven-gpu-exporter-{s}") for s in ("cloud", "edge"))
    for ds, op in ((cloud, "DoesNotExist"), (edge, "Exists")):
        assert ds["metadata"]["namespace"] == "raven-gpu-exporter"
        spec = pod_spec(ds)
        required = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        (term,) = required["nodeSelectorTerms"]
        assert term["matchExpressions"] == [{"key": "raven.io/site", "operator": op}]
        assert spec["hostPID"] is True and spec["hostNetwork"] is True
        args = container(ds, "gpu-exporter")["args"]
        assert "--kubernetes" in args and "--label-mode=upstream" in args
    monitor = find(objs, "PodMonitor", "raven-gpu-exporter-cloud")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"]["raven.io/gpu-exporter-scope"] == "cloud"
    # the cloud pods carry what the monitor selects, the edge ones not
    cloud_labels = cloud["spec"]["template"]["metadata"]["labels"]
    edge_labels = edge["spec"]["template"]["metadata"]["labels"]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    assert wanted <= cloud_labels.items() and not wanted <= edge_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][0]["targetLabel"] == "instance"
    role = find(objs, "ClusterRole", "raven-gpu-exporter")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]


def test_gpu_exporter_without_per_pod_metrics_runs_unprivileged_and_never_in_the_release_ns() -> (
    None
):
    values = with_gpu_exporter()
    values["gpuExporter"] |= {"perPodMetrics": False, "labelMode": "ack"}
    objs = render(values)
    spec = pod_spec(find(objs, "DaemonSet", "raven-gpu-exporter-cloud"))
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["hostPID"] is False
    assert "volumes" not in spec and not [o for o in objs if o["kind"] == "ClusterRole"
                                          and "gpu" in o["metadata"]["name"]]  # fmt: skip
    values["gpuExporter"]["namespace"] = NAMESPACE
    with pytest.raises(Exception, match="Pod Security privileged"):
        render(values)


def test_notes_warn_about_monitors_no_operator_selects() -> None:
    values = two_sites()
    values["serviceMonitor"] = {"enabled": True}
    with helm.Chart.load(str(CHART)) as chart:
        notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["raven/templates/NOTES.txt"]
    assert "WARNING: serviceMonitor is enabled without additionalLabels" in notes
    values["serviceMonitor"]["additionalLabels"] = {"release": "kube-prometheus-stack"}
    with helm.Chart.load(str(CHART)) as chart:
        notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["raven/templates/NOTES.txt"]
    assert "WARNING" not in notes


def test_grace_period_shorter_than_the_drain_fails_the_render() -> None:
    values = two_sites()
    values["gateway"] |= {"terminationGracePeriodSeconds": 10}
    with pytest.raises(Exception, match="terminationGracePeriodSeconds"):
        render(values)
