"""deploy/helm/raven: rendered by real Helm, validated against the Kubernetes schemas, checked
for consistency.

Helm is Helm's own Go SDK (v4) from PyPI: ``helm-python-sdk`` (import ``helm_python``, a
ctypes binding to ``libhelm_c`` shipped in the wheel; the test extras install it). Rendering
is what ``helm template`` does: values merged over values.yaml, checked against
values.schema.json, every template and helper run by Go's text/template with Sprig.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from raven import keys
from raven.cli import build_parser
from raven.config import load_agent_config, load_gateway_config
from raven.config.common import parse_hostport
from tests.unit.test_deploy_common import (
    ROOT,
    check_workloads,
    container,
    find,
    pod_spec,
    validate_object,
)

CHART = ROOT / "deploy" / "helm" / "raven"
RELEASE = {"Name": "raven", "Namespace": "raven-system", "Service": "Helm"}


# --- rendering the chart with Helm ------------------------------------------------------------


class Renderer:
    """``helm template raven deploy/helm/raven -n raven-system -f values``, in process."""

    def __init__(self, chart: Path) -> None:
        self.chart = chart

    def render(self, values: dict[str, Any]) -> dict[str, str]:
        with helm.Chart.load(str(self.chart)) as chart:
            out = chart.render(values, name=RELEASE["Name"], namespace=RELEASE["Namespace"])
        return {k: v for k, v in out.items() if not k.endswith("NOTES.txt")}


# --- rendering the chart ----------------------------------------------------------------------


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def keypair() -> tuple[str, str]:
    private = keys.generate_private_key()
    return keys.encode_key(private), keys.encode_key(keys.public_key(private))


def example_values(*, l3: bool = False, extras: bool = True) -> dict[str, Any]:
    gw_priv, gw_pub = keypair()
    a_priv, a_pub = keypair()
    _b_priv, b_pub = keypair()
    sites: list[dict[str, Any]] = [
        {"name": "site-a", "publicKey": a_pub, "privateKey": a_priv, "nodes": ["site-a-*"]},
        {
            "name": "site-b",
            "publicKey": b_pub,
            "existingSecret": "site-b-key",
            "nodes": ["site-b-gpu-1", "site-b-gpu-2"],
            "allowedPorts": [9400, 10266],
        },
    ]
    if l3:
        sites[0] |= {"prefixes": ["192.168.50.0/24"], "tunAddress": "10.99.0.2/24"}
        sites[1] |= {"prefixes": ["192.168.60.0/24"], "tunAddress": "10.99.0.3/24"}
    override: dict[str, Any] = {
        "gateway": {"publicKey": gw_pub, "privateKey": gw_priv},
        "sites": sites,
        "l3": {"enabled": l3},
        "serviceMonitor": {"enabled": extras},
        "grafanaDashboard": {"enabled": extras},
    }
    if extras:
        override["gateway"]["extraConfig"] = {"handshake_rate_per_s": 5.0}
        override["agent"] = {"extraConfig": {"reconnect": {"max_backoff_s": 10.0}}}
    return merged(default_values(), override)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for name, text in rendered.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), name
                out.append(doc)
    return out


VARIANTS = {
    "defaults-no-sites": default_values,
    "two-sites": example_values,
    "two-sites-l3": lambda: example_values(l3=True),
    "two-sites-minimal": lambda: example_values(extras=False),
}


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(CHART)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(
    request: pytest.FixtureRequest, renderer: Renderer
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    values = VARIANTS[request.param]()
    return request.param, values, objects(renderer.render(values))


# --- tests ------------------------------------------------------------------------------------


def test_every_rendered_object_is_valid_for_kubernetes(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    name, _values, objs = variant
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(ids) == len(set(ids)), name
    for o in objs:
        validate_object(o)
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == "raven", ids


def test_workloads_follow_the_security_rules(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    name, values, objs = variant
    check_workloads(objs, l3=values["l3"]["enabled"])
    gw_c = container(find(objs, "Deployment", "raven-gateway"), "gateway")
    assert ("NET_ADMIN" in gw_c["securityContext"]["capabilities"].get("add", [])) == (
        values["l3"]["enabled"]
    ), name


def test_configs_load_and_agree_with_the_objects(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    _name, values, objs = variant
    gw_path = tmp_path / "gateway.yaml"
    gw_path.write_text(find(objs, "ConfigMap", "raven-gateway-config")["data"]["gateway.yaml"])
    gw_cfg = load_gateway_config(gw_path)
    assert [a.name for a in gw_cfg.agents] == [s["name"] for s in values["sites"]]
    if values["gateway"].get("extraConfig"):
        assert (
            gw_cfg.handshake_rate_per_s == values["gateway"]["extraConfig"]["handshake_rate_per_s"]
        )
    assert gw_cfg.tun.enabled == values["l3"]["enabled"]

    gw = find(objs, "Deployment", "raven-gateway")
    assert gw["spec"]["replicas"] == values["gateway"]["replicas"]
    ports = {p["name"]: p["containerPort"] for p in container(gw, "gateway")["ports"]}
    assert ports["tunnel"] == parse_hostport(gw_cfg.tunnel_listen)[1]
    assert ports["http-proxy"] == parse_hostport(gw_cfg.proxy.http_listen)[1]
    assert ports["admin"] == parse_hostport(gw_cfg.admin_listen)[1]
    (tls,) = gw_cfg.proxy.tls_listeners
    assert parse_hostport(tls.listen)[1] == ports["tls-proxy"]
    proxy = find(objs, "Service", "raven-gateway")
    by_port = {p["port"]: p["targetPort"] for p in proxy["spec"]["ports"]}
    assert by_port[tls.target_port] == "tls-proxy"
    for scraped in values["gateway"]["scrapedPorts"]:
        assert by_port[scraped["port"]] == "http-proxy"
    tunnel = find(objs, "Service", "raven-gateway-tunnel")
    assert tunnel["spec"]["clusterIP"] == "None"
    checksum = gw["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)

    secret_names = {o["metadata"]["name"] for o in objs if o["kind"] == "Secret"}
    for site in values["sites"]:
        cm = find(objs, "ConfigMap", f"raven-agent-config-{site['name']}")
        path = tmp_path / f"{site['name']}.yaml"
        path.write_text(cm["data"]["agent.yaml"])
        cfg = load_agent_config(path)
        assert cfg.gateway == (
            f"raven-gateway-tunnel.raven-system.svc.cluster.local:{ports['tunnel']}"
        )
        assert cfg.gateway_public_key == values["gateway"]["publicKey"]
        assert cfg.kubernetes.label_selector == f"raven.io/site={site['name']}"
        assert cfg.allowed_ports == site.get(
            "allowedPorts", [9400, 9100, 10250, 10255, values["agent"]["adminPort"]]
        )
        assert cfg.tun.enabled == values["l3"]["enabled"]
        if values["l3"]["enabled"]:
            assert cfg.subnets == site["prefixes"]
        if values["agent"].get("extraConfig"):
            assert cfg.reconnect.max_backoff_s == 10.0
        (authorised,) = [a for a in gw_cfg.agents if a.name == site["name"]]
        assert authorised.public_key == site["publicKey"]
        dep = find(objs, "Deployment", f"raven-agent-{site['name']}")
        spec = pod_spec(dep)
        assert spec["hostNetwork"] and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert spec["nodeSelector"] == {
            "raven.io/edge-gateway": "true",
            "raven.io/site": site["name"],
        }
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        secret = vols["key-secret"]["secret"]["secretName"]
        if "existingSecret" in site:
            assert secret == site["existingSecret"] and secret not in secret_names
        else:
            assert secret in secret_names
            data = find(objs, "Secret", secret)["data"]["private.key"]
            assert base64.b64decode(data).decode() == site["privateKey"]
        args = build_parser().parse_args(container(dep, "agent")["args"])
        assert args.command == "agent"


def test_hosts_generator_arguments_and_rbac(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _name, values, objs = variant
    hg = values["hostsGenerator"]
    dep = find(objs, "Deployment", "raven-coredns-hosts")
    args = build_parser().parse_args(container(dep, "coredns-hosts")["args"])
    assert args.service == "raven-system/raven-gateway"
    assert args.configmap == f"{hg['configMap']['namespace']}/{hg['configMap']['name']}"
    assert args.configmap_key == hg["configMap"]["key"]
    assert args.node_selector == hg["nodeSelector"]
    role = find(objs, "Role", "raven-coredns-hosts")
    assert role["metadata"]["namespace"] == hg["configMap"]["namespace"]
    assert role["rules"][0]["resourceNames"] == [hg["configMap"]["name"]]
    cluster_role = find(objs, "ClusterRole", "raven-coredns-hosts")
    assert cluster_role["rules"][0]["resources"] == ["nodes", "services"]
    assert set(cluster_role["rules"][0]["verbs"]) == {"get", "list", "watch"}


def test_optional_parts_follow_their_switches(
    variant: tuple[str, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _name, values, objs = variant
    kinds = [o["kind"] for o in objs]
    assert kinds.count("ServiceMonitor") == (2 if values["serviceMonitor"]["enabled"] else 0)
    dashboards = [o for o in objs if o["metadata"]["name"] == "raven-grafana-dashboard"]
    assert len(dashboards) == (1 if values["grafanaDashboard"]["enabled"] else 0)
    for d in dashboards:
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads(d["data"]["raven-tunnel.json"])
        assert shipped == json.loads((ROOT / "deploy/grafana/raven-tunnel.json").read_text())
    agents = [o for o in objs if o["kind"] == "Deployment" and "agent" in o["metadata"]["name"]]
    assert len(agents) == len(values["sites"])


def test_values_follow_the_chart_schema() -> None:
    """Helm checks values against values.schema.json; so does this test, for every variant."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    for make in VARIANTS.values():
        jsonschema.validate(make(), schema)
    typo = example_values()
    typo["sites"][0]["publickey"] = typo["sites"][0].pop("publicKey")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, schema)
    bad_name = example_values()
    bad_name["sites"][0]["name"] = "Site_A"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_name, schema)


def test_chart_dashboard_copy_is_identical_to_deploy_grafana() -> None:
    assert (CHART / "dashboards" / "raven-tunnel.json").read_bytes() == (
        ROOT / "deploy" / "grafana" / "raven-tunnel.json"
    ).read_bytes()


def test_required_values_are_enforced(renderer: Renderer) -> None:
    values = example_values()
    values["gateway"]["publicKey"] = ""
    with pytest.raises(helm.HelmError, match=r"gateway\.publicKey"):
        renderer.render(values)
    values = example_values(l3=True)
    del values["sites"][0]["tunAddress"]
    with pytest.raises(helm.HelmError, match="tunAddress"):
        renderer.render(values)


def test_helm_lint_finds_no_warnings() -> None:
    """``helm lint --strict`` over the example values."""
    report = helm.lint(str(CHART), example_values(), strict=True, namespace=RELEASE["Namespace"])
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [] and report["errors"] == [], report
