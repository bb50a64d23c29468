"""The agent behind the networks real edge sites sit behind (issue 33): an HTTP forward proxy
with Basic authentication as the only way out, and a TLS-terminating Ingress (nginx) that
forwards WebSocket upgrades, with plain TCP to the gateway blocked.

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    site ns (10.200.4.2): `raven agent`, node_exporter 127.0.0.1:9100 (node edge-p-1)
      |-- 10.200.4.0/24 -- dmz ns (10.200.4.1): squid :3128, Basic auth, CONNECT to 443
      |                    and 10262 only, names from its own hosts file (gw.raven.test)
      |-- 10.200.6.0/24 -- cloud ns, only when a test opens the site's direct route
    cloud ns: gateway 10.96.2.1 (raw tunnel :10262, WebSocket :10263, proxy :10264, admin
              :10265); nginx 10.96.2.2:443 terminating TLS for gw.raven.test (a test CA)
              and forwarding /raven/tunnel upgrades to :10263; nftables drops every
              connection to :10262 that comes from the site's own link (only squid's may pass)

Each test starts its own agent and checks outcomes: the tunnel is up, a scrape of edge-p-1
through the gateway's proxy listener succeeds (a real Prometheus in the combined test), and
refusals (a wrong proxy password, a CA that did not sign the Ingress's certificate) are told
clearly in the agent's status, log and metrics, never with the password.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.certs import make_ca
from tests.helpers.e2e.netns import Lab, Netns, Proc, require_e2e, sh, veth, wait_until
from tests.helpers.e2e.nginx import NGINX, start_nginx
from tests.helpers.e2e.prometheus import Prometheus, static_job

pytestmark = pytest.mark.e2e

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMETHEUS = "/usr/bin/prometheus"
SQUID = "/usr/sbin/squid"
HTPASSWD = "/usr/bin/htpasswd"
NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"

GATEWAY, INGRESS = "10.96.2.1", "10.96.2.2"
TUNNEL_PORT, WS_PORT, PROXY_PORT, ADMIN_PORT = 10262, 10263, 10264, 10265
SQUID_ADDR, SQUID_PORT = "10.200.4.1", 3128
AGENT_ADMIN = ("127.0.0.1", 10266)
NAME = "gw.raven.test"
NODE = "edge-p-1"
USER, PASSWORD = "raven-site", "s3cret-Pa55"


@dataclass
class Net:
    lab: Lab
    site: Netns
    dmz: Netns
    cloud: Netns
    gw_public: str
    agent_key: Path
    ca_file: Path
    other_ca_file: Path
    gateway: Proc
    agent: Proc | None = None
    runs: int = 0


def start_squid(lab: Lab, dmz: Netns) -> Proc:
    """squid as the site's egress proxy: its files in a folder user ``proxy`` can read."""
    folder = Path(f"/tmp/rvn-squid-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    lab.diagnostic_hooks.append(lambda: "----- squid access.log\n" + _tail(folder / "access.log"))
    sh([HTPASSWD, "-b", "-c", str(folder / "passwd"), USER, PASSWORD])
    (folder / "hosts").write_text(f"{INGRESS} {NAME}\n")
    conf = folder / "squid.conf"
    conf.write_text(f"""
http_port {SQUID_ADDR}:{SQUID_PORT}
pid_filename {folder}/squid.pid
cache_log {folder}/cache.log
access_log stdio:{folder}/access.log
cache deny all
cache_mem 8 MB
coredump_dir {folder}
hosts_file {folder}/hosts
dns_nameservers 127.0.0.1
shutdown_lifetime 1 seconds
auth_param basic program {NCSA_AUTH} {folder}/passwd
auth_param basic realm raven-test
acl authenticated proxy_auth REQUIRED
acl tunnel_ports port 443 {TUNNEL_PORT}
acl CONNECT method CONNECT
http_access deny !authenticated
http_access allow CONNECT tunnel_ports authenticated
http_access deny all
""")
    for path in folder.iterdir():
        path.chmod(0o644)
    argv = ["setpriv", "--pdeathsig", "TERM", SQUID, "-N", "-f", str(conf),
            "-n", f"rvn{os.getpid()}"]  # fmt: skip
    proc = lab.process(dmz, "squid", argv)
    dmz.wait_for_port(SQUID_ADDR, SQUID_PORT, timeout_s=30, proc=proc)
    return proc


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def start_ingress(lab: Lab, cloud: Netns, cert: Path, key: Path) -> Proc:
    """nginx as a TLS-terminating Ingress that forwards WebSocket upgrades."""
    server = f"""  server {{
    listen {INGRESS}:443 ssl;
    server_name {NAME};
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location /raven/tunnel {{
      proxy_pass http://{GATEWAY}:{WS_PORT};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_read_timeout 60s;
      proxy_send_timeout 60s;
    }}
  }}"""
    return start_nginx(lab, cloud, server, host=INGRESS, port=443)


@pytest.fixture
def net(lab: Lab) -> Iterator[Net]:
    require_e2e(PROMETHEUS, NODE_EXPORTER, SQUID, NGINX, HTPASSWD, NCSA_AUTH)
    site, dmz, cloud = lab.netns("eg-site"), lab.netns("eg-dmz"), lab.netns("eg-cloud")
    veth(dmz, "to-site", "10.200.4.1/24", site, "up0", "10.200.4.2/24")
    veth(cloud, "to-dmz", "10.200.5.1/24", dmz, "up1", "10.200.5.2/24")
    veth(cloud, "to-site", "10.200.6.1/24", site, "up2", "10.200.6.2/24")
    dmz.add_route("10.96.0.0/16", via="10.200.5.1")
    for ip in (GATEWAY, INGRESS):
        cloud.ip("addr", "add", f"{ip}/32", "dev", "lo")
    # plain TCP to the gateway from the site's own link is blocked (only the Ingress's 443)
    cloud.nft(f"""table inet rvnfw {{
  chain input {{ type filter hook input priority 0;
    iifname "to-site" tcp dport {{ {TUNNEL_PORT}, {WS_PORT}, {PROXY_PORT} }} drop
  }}
}}
""")
    ca = make_ca(lab.workdir, "raven-test-ingress-ca")
    other_ca = make_ca(lab.workdir, "some-other-ca")
    cert, key = ca.issue(NAME, lab.workdir)
    gw_key, agent_key = lab.workdir / "gateway.key", lab.workdir / "agent.key"
    gw_public, agent_public = write_key(gw_key), write_key(agent_key)
    config = {
        "private_key_file": str(gw_key),
        "tunnel_listen": f"{GATEWAY}:{TUNNEL_PORT}",
        "admin_listen": f"{GATEWAY}:{ADMIN_PORT}",
        "agents": [{"name": "site-p", "public_key": agent_public, "nodes": ["edge-p-*"]}],
        "proxy": {"http_listen": f"{GATEWAY}:{PROXY_PORT}", "tls_listeners": []},
        "websocket": {"listen": f"{GATEWAY}:{WS_PORT}", "trusted_proxies": ["10.96.2.0/24"]},
        "log": {"level": "info"},
    }
    gw_config = lab.workdir / "gateway.yaml"
    gw_config.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "gateway", "--config", str(gw_config)]
    gateway = lab.process(cloud, "gateway", argv, env=python_env())
    cloud.wait_for_http(GATEWAY, ADMIN_PORT, "/healthz", timeout_s=30, proc=gateway)
    start_squid(lab, dmz)
    start_ingress(lab, cloud, cert, key)
    exporter = lab.process(site, "node-exporter", [
        NODE_EXPORTER, "--web.listen-address=127.0.0.1:9100", "--collector.disable-defaults",
        "--collector.loadavg"])  # fmt: skip
    site.wait_for_port("127.0.0.1", 9100, proc=exporter)
    net = Net(lab, site, dmz, cloud, gw_public, agent_key, ca.pem, other_ca.pem, gateway)
    lab.diagnostic_hooks.append(lambda: "----- agent status\n" + json.dumps(status(net)))
    yield net
    shutil.rmtree(f"/tmp/rvn-squid-{os.getpid()}", ignore_errors=True)


def start_agent(net: Net, gateway: str, env: dict[str, str], **extra: Any) -> Proc:
    if net.agent is not None:
        net.agent.stop()
    net.runs += 1
    config = {
        "private_key_file": str(net.agent_key),
        "gateway": gateway,
        "gateway_public_key": net.gw_public,
        "name": "site-p",
        "nodes": {NODE: "127.0.0.1"},
        "allowed_ports": [9100],
        "admin_listen": f"{AGENT_ADMIN[0]}:{AGENT_ADMIN[1]}",
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 1.0},
        "log": {"level": "info"},
        **extra,
    }
    path = net.lab.workdir / f"agent-{net.runs}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "agent", "--config", str(path)]
    net.agent = net.lab.process(net.site, f"agent-{net.runs}", argv,
                                env={**python_env(), **env})  # fmt: skip
    net.site.wait_for_port(*AGENT_ADMIN, timeout_s=30, proc=net.agent)
    return net.agent


def status(net: Net) -> dict[str, Any]:
    try:
        return dict(json.loads(net.site.http(*AGENT_ADMIN, "/api/v1/status").body))
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def link(net: Net) -> dict[str, Any]:
    links = status(net).get("gateways") or [{}]
    return dict(links[0])


def wait_up(net: Net) -> dict[str, Any]:
    wait_until(lambda: link(net).get("up"), 45, "the agent's tunnel up",
               procs=[net.agent, net.gateway], detail=lambda: json.dumps(status(net)))  # fmt: skip
    return link(net)


def scrape(net: Net) -> int:
    target = f"http://{NODE}:9100/metrics"
    return net.cloud.http(GATEWAY, PROXY_PORT, target, timeout_s=10).status


def agent_metric(net: Net, name: str) -> str:
    text = net.site.http(*AGENT_ADMIN, "/metrics").text
    return "\n".join(ln for ln in text.splitlines() if ln.startswith(name))


def proxy_env(password: str = PASSWORD) -> dict[str, str]:
    return {"HTTPS_PROXY": f"http://{USER}:{password}@{SQUID_ADDR}:{SQUID_PORT}",
            "NO_PROXY": "localhost,127.0.0.1,.cluster.local"}  # fmt: skip


def test_raw_tunnel_through_squid_with_basic_auth_and_a_wrong_password_told_clearly(
    net: Net,
) -> None:
    agent = start_agent(net, f"{GATEWAY}:{TUNNEL_PORT}", proxy_env())
    up = wait_up(net)
    assert up["via"] == f"http://{SQUID_ADDR}:{SQUID_PORT}", up
    assert scrape(net) == 200
    assert PASSWORD not in agent.log_text()

    agent = start_agent(net, f"{GATEWAY}:{TUNNEL_PORT}", proxy_env("wrong-password"))
    wait_until(lambda: "407" in str(link(net).get("last_error")), 30,
               "the proxy's refusal in the agent's status", procs=[agent])  # fmt: skip
    error = link(net)["last_error"]
    assert "proxy credentials" in error and f"{SQUID_ADDR}:{SQUID_PORT}" in error, error
    assert not link(net)["up"]
    metrics = agent_metric(net, "raven_transport_failures_total")
    assert 'reason="auth_required",stage="proxy"' in metrics, metrics
    log = agent.log_text()
    assert "407" in log and "wrong-password" not in log and PASSWORD not in log
    # the operator's view: `raven status --agent` names the refusal and what to fix
    shown = net.site.run([*raven_cmd(), "status", "--warn-only", "--agent",
                          f"http://{AGENT_ADMIN[0]}:{AGENT_ADMIN[1]}"])  # fmt: skip
    assert "0/1 gateway links up" in shown and "407" in shown and "proxy credentials" in shown


def test_websocket_through_a_tls_ingress_with_plain_tcp_blocked_and_a_wrong_ca_refused(
    net: Net,
) -> None:
    # the site's direct route to the cloud, where only the Ingress's 443 answers
    net.site.add_route("10.96.0.0/16", via="10.200.6.1")
    tls = {"ca_file": str(net.ca_file), "server_name": NAME}
    start_agent(net, f"wss://{INGRESS}/raven/tunnel", {}, tls=tls)
    up = wait_up(net)
    assert up["via"] is None, up
    assert scrape(net) == 200
    # the gateway saw the agent through the Ingress (trusted_proxies: the X-Forwarded-For)
    agents = json.loads(net.cloud.http(GATEWAY, ADMIN_PORT, "/api/v1/agents").body)["agents"]
    assert agents[0]["remote_address"].startswith("10.200.6.2"), agents

    agent = start_agent(net, f"wss://{INGRESS}/raven/tunnel", {},
                        tls={"ca_file": str(net.other_ca_file), "server_name": NAME})  # fmt: skip
    wait_until(lambda: "certificate verify failed" in str(link(net).get("last_error")), 30,
               "a certificate signed by another CA refused", procs=[agent])  # fmt: skip
    assert 'reason="tls_failed",stage="tls"' in agent_metric(net, "raven_transport_failures")


def test_websocket_through_squid_and_the_ingress_while_prometheus_scrapes(net: Net) -> None:
    start_agent(net, f"wss://{NAME}/raven/tunnel", proxy_env(), tls={"ca_file": str(net.ca_file)})
    up = wait_up(net)
    assert up["via"] == f"http://{SQUID_ADDR}:{SQUID_PORT}", up
    jobs = [static_job("edge", [f"{NODE}:9100"], proxy_url=f"http://{GATEWAY}:{PROXY_PORT}")]
    prom = Prometheus(net.lab, net.cloud, jobs, scrape_interval_s=1.0, scrape_timeout_s=1.0)
    prom.start()
    prom.wait_all_up({"edge": 1})
    values = prom.query_values('up{job="edge"}', by=("instance",))
    assert values == {(f"{NODE}:9100",): 1.0}, values
