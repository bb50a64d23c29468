"""A real Prometheus scrapes, by node name through the tunnel, an edge exporter that listens
only on a pod-like address behind a Service (upstream dcgm-exporter's layout: ClusterIP
Service, no hostNetwork): the agent resolves ``node:9400`` to the Service's endpoint on that
node from a Kubernetes API.

A real kube-apiserver cannot run here: the project's fake API server (tests/helpers/fakekube/, real
wire format) serves the Service and its EndpointSlice, from a thread switched into the agent's
namespace.

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    cloud ns: gateway (tunnel :10262, proxy 127.0.0.1:10264, admin 127.0.0.1:10265),
              Prometheus (a static proxy_url job and an http_sd job, both by name)
      |-- 10.200.9.0/24 -- agent ns: raven agent, fake kube-apiserver on 127.0.0.1
                             |-- 192.168.1.0/24 -- node ns: node IP 192.168.1.10 (nothing on
                                                   :9400), "pod" 10.244.1.7 with the exporter
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.e2e.netns import Lab, enter_netns, require_e2e, veth
from tests.helpers.e2e.prometheus import Prometheus, http_sd_job, static_job
from tests.helpers.e2e.raven_lab import ADMIN, PROMETHEUS, PROXY_PORT, TUNNEL_PORT, check_components
from tests.helpers.fakekube import FakeKube, make_endpoint_slice, make_exporter_service

pytestmark = pytest.mark.e2e

NODE, NODE_IP, POD_IP = "edge-gpu-1", "192.168.1.10", "10.244.1.7"
NS, SVC = "gpu-operator", "nvidia-dcgm-exporter"


def _configs(lab: Lab, kube_url: str) -> tuple[Path, Path]:
    gw_key, agent_key = lab.workdir / "gw.key", lab.workdir / "agent.key"
    gw_pub, agent_pub = write_key(gw_key), write_key(agent_key)
    kubeconfig = lab.workdir / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "edge",
                "clusters": [{"name": "fake", "cluster": {"server": kube_url}}],
                "users": [{"name": "agent", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "edge", "context": {"cluster": "fake", "user": "agent"}}],
            }
        )
    )
    gateway = {
        "private_key_file": str(gw_key),
        "tunnel_listen": f"0.0.0.0:{TUNNEL_PORT}",
        "admin_listen": f"{ADMIN[0]}:{ADMIN[1]}",
        "agents": [{"name": "site-a", "public_key": agent_pub, "nodes": ["edge-gpu-*"]}],
        "proxy": {"http_listen": f"127.0.0.1:{PROXY_PORT}", "tls_listeners": []},
    }
    agent = {
        "private_key_file": str(agent_key),
        "gateway": f"10.200.9.1:{TUNNEL_PORT}",
        "gateway_public_key": gw_pub,
        "name": "site-a",
        "nodes": {NODE: NODE_IP},
        "allowed_ports": [9400],
        "admin_listen": "127.0.0.1:10266",
        "kubernetes": {"services": [f"{NS}/{SVC}"], "kubeconfig": str(kubeconfig)},
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 1.0},
    }
    paths = lab.workdir / "gateway.yaml", lab.workdir / "agent.yaml"
    for path, body in zip(paths, (gateway, agent), strict=True):
        path.write_text(yaml.safe_dump(body))
    return paths


def test_prometheus_scrapes_an_exporter_behind_a_service_by_node_name(lab: Lab) -> None:
    require_e2e(PROMETHEUS)
    check_components()
    cloud, agent_ns, node_ns = lab.netns("svc-cloud"), lab.netns("svc-agent"), lab.netns("svc-node")
    veth(cloud, "to-site", "10.200.9.1/24", agent_ns, "up0", "10.200.9.2/24")
    veth(agent_ns, "lan0", "192.168.1.1/24", node_ns, "eth0", f"{NODE_IP}/24")
    # The pod network: the pod's address lives on the node, reached through it.
    node_ns.ip("addr", "add", f"{POD_IP}/32", "dev", "lo")
    agent_ns.add_route("10.244.1.0/24", via=NODE_IP)

    lab.process(
        node_ns,
        "dcgm-like-exporter",
        [
            *raven_cmd(),
            "gpu-exporter",
            "--simulate",
            "1",
            "-a",
            f"{POD_IP}:9400",
            "--hostname",
            NODE,
            "-c",
            "600000",
        ],
        env=python_env(),
    )
    node_ns.wait_for_port(POD_IP, 9400, timeout_s=30)
    agent_ns.wait_for_port(POD_IP, 9400, timeout_s=5)
    assert not agent_ns.port_open(NODE_IP, 9400), "the premise: nothing on the node's own :9400"

    with FakeKube(thread_setup=lambda: enter_netns(agent_ns.name)) as kube:
        kube.put("services", make_exporter_service(NS, SVC, port=9400, target="metrics"), NS)
        kube.put("endpointslices", make_endpoint_slice(NS, SVC, [(NODE, POD_IP)]), NS)
        gateway_yaml, agent_yaml = _configs(lab, kube.url)
        lab.process(
            cloud, "gateway", [*raven_cmd(), "gateway", "-c", str(gateway_yaml)], env=python_env()
        )
        cloud.wait_for_port("127.0.0.1", PROXY_PORT, timeout_s=30)
        agent = lab.process(
            agent_ns, "agent", [*raven_cmd(), "agent", "-c", str(agent_yaml)], env=python_env()
        )
        proxy_url = f"http://127.0.0.1:{PROXY_PORT}"
        jobs = [
            static_job("proxy", [f"{NODE}:9400"], proxy_url=proxy_url),
            http_sd_job(
                "http_sd",
                f"http://{ADMIN[0]}:{ADMIN[1]}/api/v1/targets?port=9400",
                refresh_s=1,
                proxy_url=proxy_url,
            ),
        ]
        prom = Prometheus(lab, cloud, jobs, listen="127.0.0.1:9090").start()
        prom.wait_all_up({"proxy": 1, "http_sd": 1}, timeout_s=60)
        result = prom.wait_query(
            'DCGM_FI_DEV_GPU_UTIL{job="proxy"}', bool, "a GPU sample scraped by name"
        )
        assert {r["metric"]["instance"] for r in result} == {f"{NODE}:9400"}
        assert {r["metric"]["Hostname"] for r in result} == {NODE}
        # The endpoint was the Service's: the agent counted it.
        metrics = agent_ns.http("127.0.0.1", 10266, "/metrics").text
        line = next(
            m
            for m in metrics.splitlines()
            if m.startswith('raven_agent_service_endpoint_connects_total{result="ok"}')
        )
        assert float(line.split()[-1]) >= 1
        assert agent.alive
        started = time.monotonic()
        # The pod moves off the node (the slice loses it): scrapes fail, nothing else dialled.
        kube.put("endpointslices", make_endpoint_slice(NS, SVC, []), NS)
        prom.wait_query('up{job="proxy"} == 0', bool, "the target down once the pod is gone")
        print(f"target down {time.monotonic() - started:.1f}s after the endpoint went away")
