"""Many agents lose their tunnels at once and come back: recovery probes are jittered and
the gateway's handshake rate limit holds the herd; every agent gets back in the end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cloud_gateway.registry import Registry
from cloud_gateway.tunnel_listener import TunnelListener
from edge_agent.gateway_link import DialSettings, GatewayLink
from raven.config.gateway import AuthorisedAgent
from raven.protocol.codes import CloseCode
from raven.telemetry.metrics import TunnelMetrics
from tests.helpers import KeyPair, wait_for
from tests.helpers.tunnel import LIMITS

pytestmark = pytest.mark.integration
AGENTS = 30


async def test_herd_after_mass_disconnect(tmp_path: Path) -> None:
    gw = KeyPair(tmp_path, "gw")
    keys = [KeyPair(tmp_path, f"a{i}") for i in range(AGENTS)]
    registry_metrics = CollectorRegistry()
    metrics = TunnelMetrics(registry_metrics, "agent")
    auth = [
        AuthorisedAgent(name=f"site-{i}", public_key=k.public_b64, nodes=[f"edge-{i}"])
        for i, k in enumerate(keys)
    ]
    registry = Registry(auth, metrics)
    # every agent comes from 127.0.0.1: one bucket of 10, refilled at 10/s, holds them all
    listener = TunnelListener(
        listen="127.0.0.1:0", static_private=gw.private, psk=bytes(32), limits=LIMITS,
        registry=registry, metrics=metrics, handshake_rate_per_s=10, handshake_burst=10,
    )  # fmt: skip
    await listener.start()
    assert listener.bound is not None
    links = []
    for i, k in enumerate(keys):
        settings = DialSettings(
            static_private=k.private, gateway_public=gw.public, psk=bytes(32), limits=LIMITS,
            min_backoff_s=0.2, max_backoff_s=2.0, probe_s=1.0,
        )  # fmt: skip
        link = GatewayLink(
            "127.0.0.1", listener.bound[1], settings, on_stream=_no_streams,
            registration=lambda i=i: ([f"edge-{i}"], []), metrics=TunnelMetrics(
                CollectorRegistry(), "gateway"), rng=random.Random(i),
        )  # fmt: skip
        links.append(link)
        link.start()
    try:
        # up as both ends see it: the gateway registers a session at the handshake, before the
        # agent's replica round trip counts the connect
        await wait_for(
            lambda: (
                len(registry.sessions) == AGENTS and all(link.tunnel is not None for link in links)
            ),
            "every agent connected",
            timeout_s=30,
        )
        limited_before = _rate_limited(registry_metrics)
        connects_before = [link.connects for link in links]
        for session in list(registry.sessions.values()):
            session.tunnel.close(CloseCode.CONNECTION_LOST, "test: mass disconnect")
        # nobody is starved: every agent is back on a new tunnel, as both ends see it (no
        # wait for "all down" first: with jittered backoff the first ones are back at once)
        await wait_for(
            lambda: (
                len(registry.sessions) == AGENTS
                and all(link.connects > n for link, n in zip(links, connects_before, strict=True))
            ),
            "every agent reconnected",
            timeout_s=30,
        )
        # the limiter refused part of the herd
        assert _rate_limited(registry_metrics) > limited_before
    finally:
        for link in links:
            await link.stop(graceful=False)
        await listener.drain(0.5)


async def _no_streams(stream: object, node: str, port: int) -> None:
    raise AssertionError("no streams in this test")


def _rate_limited(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("raven_handshakes_total", {"result": "rate_limited"}) or 0.0
