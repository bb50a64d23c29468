"""The handshake cookie on loopback: a real gateway listener forced into load mode
(``load_threshold=0``) and a real agent link. The agent comes up after one cookie round
trip on its connection; initiations with a bad mac1 are refused without any DH."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raven.protocol.noise_crypto import dh_operations
from tests.helpers import KeyPair, wait_for
from tests.helpers.sansio import initiator
from tests.helpers.tunnel import LIMITS, Site, echo_port

FLOOD = 40


def gateway_count(site: Site, result: str) -> float:
    return site.gw_metrics.handshakes.labels(result)._value.get()


def cookie_replies(site: Site) -> tuple[float, float]:
    """(sent by the gateway, accepted by the agent)."""
    return (
        site.gw_metrics.cookie_replies._value.get(),
        site.ag_metrics.cookie_replies._value.get(),
    )


async def echo_once(site: Site, node: str) -> None:
    stream = await site.registry.open_stream(node, echo_port(site), timeout_s=5)
    await stream.write(b"under load")
    assert await stream.read() == b"under load"
    await stream.aclose()


async def test_agent_comes_up_after_one_cookie_round_trip(site: Site) -> None:
    site.listener.load_threshold = 0  # always under load
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [echo_port(site)])
    await wait_for(lambda: link.connects == 1)
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    assert cookie_replies(site) == (1.0, 1.0)
    assert gateway_count(site, "ok") == 1
    assert link.cookie_jar.received == 1
    await echo_once(site, "edge-echo-1")


async def test_a_flood_with_bad_mac1_costs_no_diffie_hellman(site: Site, tmp_path: Path) -> None:
    site.listener.load_threshold = 0
    await site.listener.start()
    assert site.listener.bound is not None
    impostor = KeyPair(tmp_path, "impostor")  # made for another gateway key: mac1 is wrong
    conn = initiator(site.agent.private, impostor.public, LIMITS)
    flight = conn.data_to_send()
    dh_before = dh_operations()

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection(*site.listener.bound)  # type: ignore[misc]
        writer.write(flight)
        async with asyncio.timeout(5.0):
            answer = await reader.read()
        writer.close()
        return answer

    answers = await asyncio.gather(*(one() for _ in range(FLOOD)))
    assert answers == [b""] * FLOOD  # no cookie reply, no response: nothing
    await wait_for(lambda: gateway_count(site, "bad_mac1") == FLOOD)
    assert dh_operations() == dh_before
    assert cookie_replies(site) == (0.0, 0.0)
    # the real agent still gets through (after its cookie round trip)
    link = await site.start({"edge-echo-1": "127.0.0.1"}, [echo_port(site)])
    await wait_for(lambda: link.connects == 1)
    await wait_for(lambda: site.registry.agents_for("edge-echo-1"))
    assert cookie_replies(site) == (1.0, 1.0)
    await echo_once(site, "edge-echo-1")
