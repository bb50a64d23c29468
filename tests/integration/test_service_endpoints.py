"""Edge targets that exist: a scrape of ``node:port`` reaches the port where it really is on
that node - the node's own address when something listens there, else the ready endpoint of a
configured Service on that node (EndpointSlices by nodeName), as with upstream dcgm-exporter's
ClusterIP Service. Against tests/helpers/fakekube/ over real HTTP, with the real gateway and
agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from edge_agent.service_endpoints import ServiceEndpoints, start_service_endpoints
from raven.config.source import ConfigError
from raven.kube.client import ApiConfig, KubeClient
from tests.helpers import KeyPair, agent_config, free_port, gateway_config, wait_for
from tests.helpers.apps import gateway_and_agent
from tests.helpers.fakekube import FakeKube, make_endpoint_slice, make_exporter_service
from tests.helpers.kube import write_kubeconfig

pytestmark = pytest.mark.integration

NS, SVC = "gpu-operator", "nvidia-dcgm-exporter"
FAST = {"min_backoff_s": 0.05, "max_backoff_s": 0.2, "watch_timeout_s": (30, 30)}


async def _endpoints(kube: FakeKube, services: list[str]) -> ServiceEndpoints:
    eps = ServiceEndpoints(KubeClient(ApiConfig(kube.url)), services, **FAST)
    eps.start()
    await eps.wait_synced(5)
    return eps


async def test_candidates_follow_service_ports_and_slices_per_node() -> None:
    async with FakeKube() as kube:
        kube.put("services", make_exporter_service(NS, SVC, target="metrics"), NS)
        kube.put("services", make_exporter_service(NS, "other", port=9100), NS)
        kube.put(
            "endpointslices",
            make_endpoint_slice(
                NS, SVC, [("edge-gpu-1", "10.244.1.7"), ("edge-gpu-2", "10.244.2.7")]
            ),
            NS,
        )
        kube.put(
            "endpointslices",
            make_endpoint_slice(NS, "other", [("edge-gpu-1", "10.244.1.9")], port=9100),
            NS,
        )
        eps = await _endpoints(kube, [f"{NS}/{SVC}"])
        try:
            assert eps.synced
            assert eps.candidates("edge-gpu-1", 9400) == [("10.244.1.7", 9400)]
            assert eps.candidates("edge-gpu-2", 9400) == [("10.244.2.7", 9400)]
            assert eps.candidates("edge-gpu-3", 9400) == []  # no endpoint on that node
            assert eps.candidates("edge-gpu-1", 9100) == []  # not a port of a configured Service
            # The Service's targetPort moves (a new chart version): the slice follows.
            kube.put(
                "endpointslices",
                make_endpoint_slice(NS, SVC, [("edge-gpu-1", "10.244.1.8")], port=19400),
                NS,
            )
            await wait_for(lambda: eps.candidates("edge-gpu-1", 9400) == [("10.244.1.8", 19400)])
            assert eps.candidates("edge-gpu-2", 9400) == []
            # A pod that is not ready is no candidate.
            kube.put(
                "endpointslices",
                make_endpoint_slice(NS, SVC, [("edge-gpu-1", "10.244.1.8")], ready=False),
                NS,
            )
            await wait_for(lambda: eps.candidates("edge-gpu-1", 9400) == [])
            requests = kube.watch_requests(
                f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
            )
            assert requests[0]["labelSelector"] == f"kubernetes.io/service-name={SVC}"
        finally:
            await eps.stop()


async def test_start_service_endpoints_unreachable_api_starts_anyway() -> None:
    eps = await start_service_endpoints(
        [f"{NS}/{SVC}"],
        ApiConfig(f"http://127.0.0.1:{free_port()}"),
        first_sync_timeout_s=0.3,
        **FAST,
    )
    try:
        assert not eps.synced and eps.candidates("edge-gpu-1", 9400) == []
    finally:
        await eps.stop()


async def _exporter(host: str, body: bytes) -> AsyncIterator[int]:
    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def test_scrape_by_name_reaches_the_service_endpoint_on_that_node(tmp_path: Path) -> None:
    """Node edge-gpu-1 is 127.0.0.1, where nothing listens on the scraped port; the exporter
    listens only on the pod-like address 127.0.0.2 behind a Service. A scrape of
    edge-gpu-1:PORT through the gateway's proxy reaches it; edge-gpu-2 (served, but without an
    endpoint) is refused; an address outside the served nodes is never dialled."""

    port = free_port()  # the Service port, closed on the node's own address
    gen = _exporter("127.0.0.2", b"DCGM_FI_DEV_GPU_UTIL 42\n")
    pod_port = await gen.__anext__()
    async with FakeKube() as kube:
        kube.put("services", make_exporter_service(NS, SVC, port=port, target="metrics"), NS)
        kube.put(
            "endpointslices",
            make_endpoint_slice(
                NS, SVC, [("edge-gpu-1", "127.0.0.2"), ("edge-gpu-9", "127.0.0.2")], port=pod_port
            ),
            NS,
        )
        gw_key, agent_key = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
        agents = [{"name": "site-a", "public_key": agent_key.public_b64, "nodes": ["edge-gpu-*"]}]
        kubernetes = {
            "services": [f"{NS}/{SVC}"],
            "kubeconfig": write_kubeconfig(tmp_path, {"server": kube.url}),
        }
        nodes = {"edge-gpu-1": "127.0.0.1", "edge-gpu-2": "127.0.0.1"}
        apps = gateway_and_agent(
            gateway_config(tmp_path, gw_key, agents),
            lambda address: agent_config(
                agent_key, gw_key, address, nodes, allowed_ports=[port], kubernetes=kubernetes
            ),
        )
        async with apps as (gateway, agent):
            host, proxy_port = gateway.proxy.http_address
            async with aiohttp.ClientSession() as s:

                async def scrape(node: str) -> tuple[int, str]:
                    url = f"http://{host}:{proxy_port}/proxy/{node}:{port}/metrics"
                    async with s.get(url) as r:
                        return r.status, await r.text()

                await wait_for(lambda: agent.relay.nodes != {}, timeout_s=5)
                status, text = await scrape("edge-gpu-1")
                assert (status, text) == (200, "DCGM_FI_DEV_GPU_UTIL 42\n")
                status, text = await scrape("edge-gpu-2")
                assert status == 502 and "refused" in text
                status, _ = await scrape("edge-gpu-9")  # an endpoint, but not a served node
                assert status != 200
            sample = agent.metrics_registry.get_sample_value
            assert sample("raven_agent_service_endpoint_connects_total", {"result": "ok"}) == 1
    await gen.aclose()


@pytest.mark.parametrize("bad", ["gpu", "/x", "ns/", "a/b/c"])
def test_services_config_must_be_namespace_slash_name(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes\.services: .* is not namespace/name"):
        agent_config(
            KeyPair(tmp_path, "a"),
            KeyPair(tmp_path, "g"),
            "127.0.0.1:1",
            {},
            kubernetes={"services": [bad]},
        )
