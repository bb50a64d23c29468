"""deploy/helm/raven with backfill (docs/backfill.md): the gateway's and the agents' backfill
sections agree with the chart's values, its ScrapeConfigs and the agent's buffer volume; the
values schema and the render refuse what would not work. Every backfill variant also runs
through the generic checks of tests/unit/test_deploy_helm.py (strict validation, Pod Security
"restricted", the configs loaded with the real config classes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from raven.config.agent import load_agent_config
from raven.config.backfill import BackfillJob
from raven.config.gateway import load_gateway_config
from raven.config.remote_write import RemoteWriteConfig, RemoteWriteTlsConfig
from raven_cli.commands.check_config import check_file
from tests.helpers.chart import (
    CHART,
    VARIANTS,
    documented_backfill_values,
    kube_prometheus_stack,
    render,
    two_sites,
)
from tests.helpers.deploy import ROOT, container, find, pod_spec

BACKFILL = sorted(n for n in VARIANTS if "backfill" in n)
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over values.yaml (maps merge, anything else replaces)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def quantity_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kMG]i?|)", text).groups()  # type: ignore[union-attr]
    return int(number) * _UNITS[unit]


@pytest.fixture(scope="module", params=BACKFILL)
def variant(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = VARIANTS[request.param]()
    return merged(DEFAULTS, values), render(values)


def test_gateway_backfill_section_maps_the_values(
    variant: tuple[dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    values, objs = variant
    path = tmp_path / "gateway.yaml"
    path.write_text(find(objs, "ConfigMap", "raven-gateway-config")["data"]["gateway.yaml"])
    assert check_file(str(path), key_files=False) == ("gateway", [])  # raven check-config
    cfg = load_gateway_config(path).backfill
    want = values["gateway"]["backfill"]
    assert cfg.enabled
    assert cfg.remote_write_url == want["remoteWriteUrl"]
    assert cfg.out_of_order_window_s == want["outOfOrderWindowSeconds"]
    assert cfg.max_clock_skew_s == want["maxClockSkewSeconds"]
    assert cfg.timeout_s == want["timeoutSeconds"]
    assert cfg.max_retry_after_s == want["maxRetryAfterSeconds"]
    assert cfg.receivers == want["receivers"]
    check_remote_write(cfg.remote_write, want["remoteWrite"], objs)
    if want["jobs"]:
        expected = [
            BackfillJob(
                port=j["port"],
                job=j["job"],
                instance=j.get("instance", "{node}:{port}"),
                honor_labels=j.get("honorLabels", False),
                discovery_labels=j.get("discoveryLabels", False),
                labels=j.get("labels", {}),
                mode=j.get("mode"),
                path=j.get("path"),
            )
            for j in want["jobs"]
        ]
    else:  # the chart's own ScrapeConfigs: their job name, instance = node:port, http_sd labels
        expected = []
        for sc in (o for o in objs if o["kind"] == "ScrapeConfig"):
            (sd,) = sc["spec"]["httpSDConfigs"]
            port = int(sd["url"].rsplit("port=", 1)[1])
            expected.append(
                BackfillJob(port=port, job=sc["spec"]["jobName"], discovery_labels=True)
            )
            assert {"sourceLabels": ["__address__"], "targetLabel": "instance"} in (
                sc["spec"]["relabelings"]
            )
        assert len(expected) == len(values["scrapeConfig"]["ports"])
    assert sorted(cfg.jobs, key=lambda j: (j.port, j.job)) == sorted(
        expected, key=lambda j: (j.port, j.job)
    )


def check_remote_write(client: RemoteWriteConfig, want: dict[str, Any], objs: list[Any]) -> None:
    """The receiver's settings point into the mounted Secret, key for key."""
    deployment = find(objs, "Deployment", "raven-gateway")
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    mounts = {m["name"]: m for m in container(deployment, "gateway")["volumeMounts"]}
    if not want["secretName"]:
        assert client == RemoteWriteConfig(headers=want["headers"])
        assert "remote-write" not in volumes
        return
    assert volumes["remote-write"]["secret"]["secretName"] == want["secretName"]
    assert mounts["remote-write"] == {"name": "remote-write", "readOnly": True,
                                      "mountPath": "/etc/raven/remote-write"}  # fmt: skip

    def files(key: str) -> str | None:
        return f"/etc/raven/remote-write/{key}" if key else None

    basic, tls = want["basicAuth"], want["tls"]
    assert client.bearer_token_file == files(want["bearerTokenKey"])
    assert (client.basic_auth.username, client.basic_auth.password_file) == (  # type: ignore[union-attr]
        basic["username"], files(basic["passwordKey"]))  # fmt: skip
    assert client.tls_config == RemoteWriteTlsConfig(
        ca_file=files(tls["caKey"]),
        cert_file=files(tls["certKey"]),
        key_file=files(tls["keyKey"]),
        server_name=tls["serverName"] or None,
        insecure_skip_verify=tls["insecureSkipVerify"],
    )
    assert client.headers == want["headers"]


@pytest.mark.parametrize(
    ("remote_write", "message"),
    [
        ({"bearerTokenKey": "token"}, "secretName, which is empty"),
        (
            {
                "secretName": "s",
                "bearerTokenKey": "t",
                "basicAuth": {"username": "u", "passwordKey": "p"},
            },
            "exclude each other",
        ),
        ({"secretName": "s", "basicAuth": {"username": "u"}}, "go together"),
        ({"secretName": "s", "tls": {"certKey": "tls.crt"}}, "go together"),
    ],
)
def test_remote_write_settings_that_cannot_work_fail_the_render(
    remote_write: dict[str, Any], message: str
) -> None:
    values = VARIANTS["backfill-pvc"]()
    values["gateway"]["backfill"]["remoteWrite"] = remote_write
    with pytest.raises(Exception, match=message):
        render(values)


def test_per_scraper_receivers_need_the_template() -> None:
    values = VARIANTS["backfill-pvc"]()
    values["gateway"]["backfill"]["receivers"] = "per_scraper"
    with pytest.raises(Exception, match=re.escape("holds {scraper} exactly when")):
        render(values)
    values["gateway"]["backfill"]["remoteWriteUrl"] = "http://{scraper}:9090/api/v1/write"
    gateway = find(render(values), "ConfigMap", "raven-gateway-config")["data"]["gateway.yaml"]
    backfill = yaml.safe_load(gateway)["backfill"]
    assert backfill["receivers"] == "per_scraper"
    assert backfill["remote_write_url"] == "http://{scraper}:9090/api/v1/write"


def test_agent_buffer_is_on_its_volume(
    variant: tuple[dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    values, objs = variant
    want = values["agent"]["backfill"]
    persistence = want["persistence"]
    claims = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"}
    assert len(claims) == (len(values["sites"]) if persistence["enabled"] else 0)
    for s in values["sites"]:
        path = tmp_path / "agent.yaml"
        cm = find(objs, "ConfigMap", f"raven-agent-config-{s['name']}")
        path.write_text(cm["data"]["agent.yaml"])
        assert check_file(str(path), key_files=False) == ("agent", [])
        cfg = load_agent_config(path).backfill
        assert cfg.enabled
        assert cfg.max_bytes == want["maxBytes"] and cfg.max_age_s == want["maxAgeSeconds"]
        assert cfg.synchronous == want["synchronous"]
        for key, value in want.get("extraConfig", {}).items():
            got = getattr(cfg, key)
            assert (
                (got == value)
                if key != "targets"
                else [t.node for t in got] == [t["node"] for t in value]
            )
        dep = find(objs, "Deployment", f"raven-agent-{s['name']}")
        (mount,) = [m for m in container(dep, "agent")["volumeMounts"] if m["name"] == "buffer"]
        assert mount["mountPath"] == cfg.dir and not mount.get("readOnly", False)
        spec = pod_spec(dep)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "buffer"]
        # Non-root and writable: the pod's fsGroup owns the volume (Pod Security "restricted").
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
        if persistence["enabled"]:
            claim = claims[volume["persistentVolumeClaim"]["claimName"]]
            assert claim["metadata"]["labels"]["raven.io/site"] == s["name"]
            assert claim["spec"]["accessModes"] == persistence["accessModes"]
            assert claim["spec"].get("storageClassName") == (persistence["storageClass"] or None)
            assert claim["metadata"].get("annotations", {}) == persistence["annotations"]
            size = claim["spec"]["resources"]["requests"]["storage"]
            assert dep["spec"]["strategy"]["type"] == "Recreate", "ReadWriteOnce: one pod"
        else:
            size = volume["emptyDir"]["sizeLimit"]
            assert size == persistence["emptyDirSizeLimit"]
        # The buffer plus its WAL (an eighth more, at most 8 MiB) fits the volume.
        assert cfg.max_bytes + min(cfg.max_bytes // 8, 8 * 2**20) < quantity_bytes(size)


def test_network_policies_leave_the_gateway_egress_open(
    variant: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """The gateway must reach Prometheus's remote-write receiver: the policies restrict ingress
    only (an Egress policy would need a rule for the remoteWriteUrl's port)."""
    _values, objs = variant
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
        assert "egress" not in policy["spec"]


def test_documented_prometheus_window_is_the_gateway_window() -> None:
    """docs/kubernetes.md's kube-prometheus-stack block and the chart's backfill block give
    Prometheus and the gateway the same out-of-order window."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    block = text.split("<!-- values: kube-prometheus-stack backfill -->\n```yaml\n", 1)[1]
    spec = yaml.safe_load(block.split("```", 1)[0])["prometheus"]["prometheusSpec"]
    assert spec["enableRemoteWriteReceiver"] is True
    number, unit = re.fullmatch(r"(\d+)([smh])", spec["tsdb"]["outOfOrderTimeWindow"]).groups()  # type: ignore[union-attr]
    window = int(number) * {"s": 1, "m": 60, "h": 3600}[unit]
    values = documented_backfill_values()
    assert values["gateway"]["backfill"]["outOfOrderWindowSeconds"] == window
    assert values["agent"]["backfill"]["maxAgeSeconds"] <= window


def test_backfill_is_off_by_default() -> None:
    objs = render(kube_prometheus_stack())
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    for cm in (o for o in objs if o["kind"] == "ConfigMap" and "data" in o):
        for text in cm["data"].values():
            assert "backfill:" not in text, cm["metadata"]["name"]


def test_backfill_without_jobs_or_scrape_config_fails_the_render() -> None:
    values = two_sites()
    values["gateway"]["backfill"] = {"enabled": True}
    with pytest.raises(
        helm.HelmError, match=r"gateway\.backfill\.enabled needs gateway\.backfill\.jobs"
    ):
        render(values)


@pytest.mark.parametrize(
    "backfill",
    [
        {"gateway": {"enabled": True, "remoteWriteURL": "http://p:9090/api/v1/write"}},
        {"gateway": {"remoteWriteUrl": "prometheus:9090"}},
        {"gateway": {"jobs": [{"port": 9400, "job": "x", "honor_labels": True}]}},
        {"gateway": {"outOfOrderWindowSeconds": 0}},
        {"agent": {"maxBytes": 1024}},
        {"agent": {"synchronous": "off"}},
        {"agent": {"persistance": {"enabled": True}}},
        {"agent": {"persistence": {"size": "2 GB"}}},
        {"agent": {"persistence": {"accessModes": ["ReadOnlyMany"]}}},
    ],
)
def test_values_schema_rejects_backfill_typos(backfill: dict[str, Any]) -> None:
    values = kube_prometheus_stack()
    for part, settings in backfill.items():
        values[part]["backfill"] = settings
    with pytest.raises(helm.HelmValuesError):
        render(values)
