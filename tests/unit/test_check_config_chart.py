"""`raven check-config rendered.yaml`: a chart rendered by real Helm (the example overlay's
values, real keys) passes; each way its configs and objects can disagree is one finding, with
the file, the ConfigMap and the line inside its config, or the object's first line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from raven import keys
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("helm_python", reason="helm-python-sdk missing: pip install -e .[test]")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    gen = load_script(ROOT / "scripts" / "gen_manifests.py")
    values = yaml.safe_load((ROOT / "deploy/kustomize/overlays/example/values.yaml").read_text())
    values["gateway"]["publicKey"] = keys.encode_key(keys.public_key(keys.generate_private_key()))
    values["sites"][0]["publicKey"] = keys.encode_key(keys.public_key(keys.generate_private_key()))
    objs: list[dict[str, Any]] = gen.render(values)
    return objs


def _check(tmp_path: Path, objs: list[dict[str, Any]]) -> tuple[int, list[str], str]:
    path = tmp_path / "rendered.yaml"
    path.write_text("".join("---\n" + yaml.safe_dump(o, sort_keys=False) for o in objs))
    proc = subprocess.run([sys.executable, "-m", "raven_cli.main", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc.returncode, proc.stderr.splitlines(), proc.stdout


def _obj(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _config(objs: list[dict[str, Any]], name: str, key: str) -> dict[str, Any]:
    return yaml.safe_load(_obj(objs, "ConfigMap", name)["data"][key])  # type: ignore[no-any-return]


def _set_config(objs: list[dict[str, Any]], name: str, key: str, data: dict[str, Any]) -> None:
    _obj(objs, "ConfigMap", name)["data"][key] = yaml.safe_dump(data, sort_keys=False)


def test_the_rendered_example_passes(tmp_path: Path, rendered: list[dict[str, Any]]) -> None:
    code, err, out = _check(tmp_path, rendered)
    assert code == 0, err
    assert "[ConfigMap/raven-gateway-config gateway.yaml]: ok (gateway config)" in out
    assert "[ConfigMap/raven-agent-config-site-a agent.yaml]: ok (agent config)" in out
    assert "rendered.yaml: ok (rendered chart: ports agree)" in out


def test_a_listener_the_pod_does_not_expose(tmp_path: Path, rendered: list[dict[str, Any]]) -> None:
    objs = yaml.safe_load(yaml.safe_dump(rendered))
    gw = _config(objs, "raven-gateway-config", "gateway.yaml")
    gw["tunnel_listen"] = "0.0.0.0:10999"
    _set_config(objs, "raven-gateway-config", "gateway.yaml", gw)
    code, err, _ = _check(tmp_path, objs)
    assert code == 2
    line = next(e for e in err if "tunnel_listen:" in e)
    where = f"{tmp_path}/rendered.yaml[ConfigMap/raven-gateway-config gateway.yaml]"
    assert line.startswith(f"{where}:2:")
    assert "port 10999 is not a container port of Deployment/raven-gateway" in line
    # and the agent's Service port now reaches something else than the tunnel listener
    agent = next(e for e in err if "agent.yaml]" in e and "gateway:" in e)
    assert (
        "Service/raven-gateway-tunnel port 10262 reaches container port 10262, not the "
        "gateway's tunnel_listen (0.0.0.0:10999)" in agent
    )


def test_probe_and_service_ports(tmp_path: Path, rendered: list[dict[str, Any]]) -> None:
    objs = yaml.safe_load(yaml.safe_dump(rendered))
    container = _obj(objs, "Deployment", "raven-gateway")["spec"]["template"]["spec"][
        "containers"][0]  # fmt: skip
    container["readinessProbe"]["httpGet"]["port"] = "http-proxy"
    service = _obj(objs, "Service", "raven-gateway")
    service["spec"]["ports"][0]["targetPort"] = "http"
    code, err, _ = _check(tmp_path, objs)
    assert code == 2
    probe = next(e for e in err if "readinessProbe" in e)
    assert "Deployment/raven-gateway: probes port 'http-proxy', not the admin port 10265" in probe
    assert probe.startswith(f"{tmp_path}/rendered.yaml:")
    target = next(e for e in err if "Service/raven-gateway:" in e)
    assert "targetPort 'http' is not a container port of Deployment/raven-gateway" in target


def test_agent_pointing_at_a_wrong_port_or_its_own_key(
    tmp_path: Path, rendered: list[dict[str, Any]]
) -> None:
    objs = yaml.safe_load(yaml.safe_dump(rendered))
    gw = _config(objs, "raven-gateway-config", "gateway.yaml")
    agent = _config(objs, "raven-agent-config-site-a", "agent.yaml")
    agent["gateway"] = "raven-gateway-tunnel.raven-system.svc.cluster.local:10264"
    agent["gateway_public_key"] = gw["agents"][0]["public_key"]  # the site's own key
    agent["nodes"] = {"site-b-gpu-1": "10.0.0.1"}  # not under site-a-*
    _set_config(objs, "raven-agent-config-site-a", "agent.yaml", agent)
    code, err, _ = _check(tmp_path, objs)
    assert code == 2
    where = f"{tmp_path}/rendered.yaml[ConfigMap/raven-agent-config-site-a agent.yaml]"
    mine = [e for e in err if e.startswith(where + ":")]
    assert any("gateway: port 10264 is not a port of Service/raven-gateway-tunnel (10262, "
               "10265)" in e for e in mine), err  # fmt: skip
    assert any("gateway_public_key: is the public key of" in e and "'site-a', this agent's "
               "own key" in e for e in mine), err  # fmt: skip
    assert any("nodes.site-b-gpu-1: not covered by" in e for e in mine), err


def test_not_a_chart(tmp_path: Path) -> None:
    objs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}]
    code, err, _ = _check(tmp_path, objs)
    assert code == 2
    assert "no ConfigMap with a gateway.yaml or agent.yaml" in err[0]
