"""One tunnel to every gateway replica, replicas found through a real DNS server (dnsmasq)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.registry import Registry
from cloud_gateway.tunnel_listener import TunnelListener
from edge_agent.dialer import Dialer
from edge_agent.gateway_link import DialSettings, GatewayLink
from edge_agent.relay import Relay
from raven.config.gateway import AuthorisedAgent
from raven.protocol.limits import Limits
from raven.telemetry.metrics import TunnelMetrics
from tests.helpers import KeyPair, free_port, start_echo_server, wait_for
from tests.helpers.dnsmasq import running_dnsmasq

LIMITS = Limits(keepalive_interval_s=0.5, dead_peer_timeout_s=2.0, drain_timeout_s=0.5)
REPLICAS = ["127.0.0.2", "127.0.0.3"]


def write_hosts(directory: Path, addresses: list[str]) -> None:
    tmp = directory / ".gateway.tmp"
    tmp.write_text("".join(f"{a} gw.raven.test\n" for a in addresses))
    tmp.rename(directory / "gateway")


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    hosts = tmp_path / "hosts.d"
    hosts.mkdir()
    write_hosts(hosts, REPLICAS)
    with running_dnsmasq(hosts, tmp_path) as port:
        yield hosts, port


@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[tuple[KeyPair, KeyPair, list[Registry], int]]:
    gw, agent = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
    auth = AuthorisedAgent(name="site-a", public_key=agent.public_b64, nodes=["edge-*"])
    port = free_port("127.0.0.2")
    registries, listeners = [], []
    for addr in REPLICAS:
        reg = Registry([auth], TunnelMetrics(CollectorRegistry()))
        lst = TunnelListener(
            listen=f"{addr}:{port}",
            static_private=gw.private,
            psk=bytes(32),
            limits=LIMITS,
            registry=reg,
            metrics=reg.metrics,
            handshake_rate_per_s=50,
            handshake_burst=50,
        )
        await lst.start()
        registries.append(reg)
        listeners.append(lst)
    yield gw, agent, registries, port
    for lst in listeners:
        await lst.drain(0.2)


async def test_agent_keeps_a_tunnel_to_every_replica(dnsmasq, gateways) -> None:
    hosts, dns_port = dnsmasq
    gw, agent, registries, gw_port = gateways
    echo = await start_echo_server()
    echo_port = int(echo.sockets[0].getsockname()[1])
    relay = Relay({"edge-echo-1": "127.0.0.1"}, [echo_port], 2.0, CollectorRegistry())
    settings = DialSettings(agent.private, gw.public, bytes(32), LIMITS, 0.05, 0.3)
    metrics = TunnelMetrics(CollectorRegistry(), "gateway")

    def make_link(address: str, port: int) -> GatewayLink:
        return GatewayLink(
            address,
            port,
            settings,
            on_stream=relay.handle,
            registration=lambda: (["edge-echo-1"], []),
            metrics=metrics,
        )

    dialer = Dialer(
        f"gw.raven.test:{gw_port}",
        settings,
        link_factory=make_link,
        resolve_interval_s=0.2,
        dns_server=f"127.0.0.1:{dns_port}",
    )
    dialer.start()
    try:
        # a scrape landing on either replica finds the agent
        await wait_for(lambda: all(r.agents_for("edge-echo-1") for r in registries), timeout_s=15)
        for reg in registries:
            stream = await reg.open_stream("edge-echo-1", echo_port, timeout_s=5)
            await stream.write(b"hello")
            assert await stream.read() == b"hello"
            await stream.aclose()
        # a replica vanishes from DNS: its link is dropped
        write_hosts(hosts, REPLICAS[:1])
        await wait_for(lambda: sorted(dialer.links) == REPLICAS[:1], timeout_s=15)
        await wait_for(lambda: not registries[1].sessions, timeout_s=10)
        assert registries[0].agents_for("edge-echo-1")
        # and comes back
        write_hosts(hosts, REPLICAS)
        await wait_for(lambda: all(r.agents_for("edge-echo-1") for r in registries), timeout_s=15)
    finally:
        await dialer.stop()
        echo.close()
        await echo.wait_closed()
        await asyncio.sleep(0)
