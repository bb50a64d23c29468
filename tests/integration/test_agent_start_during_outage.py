"""An agent started while the path to its gateway is broken (connects time out) probes fast, as
after a lost tunnel, instead of backing off exponentially: scrapes resume within seconds of the
path returning, not up to ``max_backoff_s`` later."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edge_agent.gateway_link import DialSettings, GatewayLink
from raven.telemetry.metrics import TunnelMetrics
from tests.helpers import KeyPair
from tests.helpers.tunnel import LIMITS

pytestmark = pytest.mark.integration


def black_hole() -> tuple[socket.socket, socket.socket]:
    """A loopback listener whose accept queue is full: further SYNs are dropped, so a connect
    times out as it does across a broken path (no RST, no answer)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = socket.create_connection(server.getsockname(), timeout=5)
    return server, filler


async def test_an_agent_started_during_an_outage_probes_fast(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent.gateway_link")
    server, filler = black_hole()
    gw, agent = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
    settings = DialSettings(
        static_private=agent.private, gateway_public=gw.public, psk=bytes(32), limits=LIMITS,
        min_backoff_s=20.0, max_backoff_s=60.0, probe_s=0.2,
    )  # fmt: skip
    link = GatewayLink(
        "127.0.0.1", server.getsockname()[1], settings, on_stream=_no_streams,
        registration=lambda: (["edge-1"], []),
        metrics=TunnelMetrics(CollectorRegistry(), "agent"), rng=random.Random(3),
    )  # fmt: skip
    link.start()
    try:
        await asyncio.sleep(3.0)
    finally:
        await link.stop(graceful=False)
        filler.close()
        server.close()
    failed = [r for r in caplog.records if r.getMessage() == "gateway link failed"]
    delays = [r.__dict__["delay_s"] for r in caplog.records if r.getMessage() == "reconnecting"]
    # each connect gives up after 2 x probe_s and the next comes within probe_s: several tries
    # in 3 s, where the exponential backoff (20 s bound) would allow one or two
    assert len(failed) >= 3, [r.getMessage() for r in caplog.records]
    assert delays and max(delays) <= 0.2
    assert link.attempt == 0  # the backoff never started


async def _no_streams(stream: object, node: str, port: int) -> None:
    raise AssertionError("no streams in this test")
