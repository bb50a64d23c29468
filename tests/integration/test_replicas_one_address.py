"""Several gateway replicas behind one address, on loopback (no root needed; the namespace
version with nftables DNAT and a real Prometheus is tests/e2e/test_replicas_one_address_netns.py).

A small TCP load balancer (a relay choosing a replica at random for each new connection, as
kube-proxy does) stands in front of three TunnelListeners; the agent's Dialer is given only
the balancer's address. It ends up with a tunnel to every replica; its duplicate dials never
disturb a held tunnel; a replica that drains is replaced by the one that comes in its place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
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
from tests.helpers import KeyPair, start_echo_server, wait_for
from tests.helpers.balancer import RandomBalancer

pytestmark = pytest.mark.integration

LIMITS = Limits(keepalive_interval_s=0.5, dead_peer_timeout_s=3.0, drain_timeout_s=0.5)


@dataclass
class Replica:
    registry: Registry
    listener: TunnelListener


@pytest.fixture
async def cloud(
    tmp_path: Path,
) -> AsyncIterator[tuple[KeyPair, KeyPair, list[Replica], RandomBalancer]]:
    gw, agent = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
    balancer = RandomBalancer()
    replicas = [await start_replica(gw, agent, f"replica-{i}", 3) for i in range(3)]
    balancer.backends = [r.listener.bound for r in replicas if r.listener.bound is not None]
    yield gw, agent, replicas, balancer
    for replica in replicas:
        await replica.listener.drain(0.2)
    balancer.close()


async def start_replica(gw: KeyPair, agent: KeyPair, replica_id: str, count: int) -> Replica:
    auth = AuthorisedAgent(name="site-a", public_key=agent.public_b64, nodes=["edge-*"])
    registry = Registry([auth], TunnelMetrics(CollectorRegistry()))
    listener = TunnelListener(
        listen="127.0.0.1:0", static_private=gw.private, psk=bytes(32), limits=LIMITS,
        registry=registry, metrics=registry.metrics, handshake_rate_per_s=100,
        handshake_burst=100, replica_id=replica_id, replicas=count,
    )  # fmt: skip
    await listener.start()
    return Replica(registry, listener)


def held(dialer: Dialer) -> set[str]:
    return set(dialer.claims)


async def test_one_address_reaches_every_replica_and_a_drained_one_is_replaced(cloud) -> None:  # type: ignore[no-untyped-def]
    gw, agent, replicas, balancer = cloud
    lb_port = await balancer.start()
    echo = await start_echo_server()
    echo_port = int(echo.sockets[0].getsockname()[1])
    relay = Relay({"edge-echo-1": "127.0.0.1"}, [echo_port], 2.0, CollectorRegistry())
    settings = DialSettings(agent.private, gw.public, bytes(32), LIMITS, 0.05, 0.5,
                            replica_retry_max_s=0.2)  # fmt: skip
    metrics = TunnelMetrics(CollectorRegistry(), "gateway")

    def make_link(address: str, port: int) -> GatewayLink:
        return GatewayLink(address, port, settings, on_stream=relay.handle,
                           registration=lambda: (["edge-echo-1"], []), metrics=metrics)  # fmt: skip

    dialer = Dialer(f"127.0.0.1:{lb_port}", settings, link_factory=make_link,
                    resolve_interval_s=60)  # fmt: skip
    dialer.start()
    try:
        await wait_for(lambda: held(dialer) == {"replica-0", "replica-1", "replica-2"},
                       "the agent holds all three replicas", timeout_s=20)  # fmt: skip
        await wait_for(lambda: all(r.registry.agents_for("edge-echo-1") for r in replicas))
        assert dialer.wanted() == 3
        sessions = [r.registry.sessions["site-a"] for r in replicas]
        for replica in replicas:  # a scrape landing on any replica finds the agent
            stream = await replica.registry.open_stream("edge-echo-1", echo_port, timeout_s=5)
            await stream.write(b"hello")
            assert await stream.read() == b"hello"
            await stream.aclose()
        dials = balancer.connections
        assert dials >= 3
        # every duplicate dial was closed before registering: no held tunnel was replaced
        closes = [r.registry.metrics.tunnel_closes for r in replicas]
        assert all(c.labels("replaced")._value.get() == 0 for c in closes)
        assert [r.registry.sessions["site-a"] for r in replicas] == sessions

        # replica 0 drains (a rolling update) and replica 3 comes in its place
        balancer.backends.remove(replicas[0].listener.bound)  # type: ignore[arg-type]
        successor = await start_replica(gw, agent, "replica-3", 3)
        assert successor.listener.bound is not None
        balancer.backends.append(successor.listener.bound)
        await replicas[0].listener.drain(0.5)
        replicas.append(successor)
        await wait_for(lambda: held(dialer) == {"replica-1", "replica-2", "replica-3"},
                       "the agent holds the successor", timeout_s=20)  # fmt: skip
        await wait_for(lambda: bool(successor.registry.agents_for("edge-echo-1")))
        assert [r.registry.sessions["site-a"] for r in replicas[1:3]] == sessions[1:3]
        await wait_for(lambda: len(dialer.all_links()) == 3, "one link per replica")
        # the Deployment is scaled to 4 (config reload): the agent searches for the fourth
        for replica in replicas[1:]:
            replica.listener.announce_replicas(4)
        await wait_for(lambda: dialer.wanted() == 4 and len(dialer.all_links()) == 4)
        duplicates = dialer.replica_metrics.dials.labels("duplicate")
        before = duplicates._value.get()
        await wait_for(lambda: duplicates._value.get() > before, "a spare link dials")
        fourth = await start_replica(gw, agent, "replica-4", 4)
        assert fourth.listener.bound is not None
        balancer.backends.append(fourth.listener.bound)
        replicas.append(fourth)
        await wait_for(lambda: "replica-4" in held(dialer), "the fourth replica held", timeout_s=20)
    finally:
        await dialer.stop()
        echo.close()
        await echo.wait_closed()
