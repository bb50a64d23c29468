"""The registry applies and drops large registrations a slice per event-loop turn.

A full registration (16,384 names) indexed or unindexed in one turn held the gateway's loop
~50 ms, every other site's scrapes with it; an authorised agent could repeat it once per
control budget. Each test steps the loop one turn at a time (``asyncio.sleep(0)``) and
looks at the index between turns: never more than CHECK_ENTRIES_PER_TURN entries move in
one turn, nodes in both the old and the new set stay routed throughout, and a session that
is gone is never routed to while its entries are swept.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Coroutine
from typing import Any, cast

from prometheus_client import CollectorRegistry

from cloud_gateway.registry import CHECK_ENTRIES_PER_TURN, AgentSession, Registry
from raven.config.gateway import AuthorisedAgent
from raven.protocol.codes import CloseCode
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.tunnel import Tunnel

AGENT = AuthorisedAgent(
    name="site-a", public_key=base64.b64encode(bytes(range(1, 33))).decode(), nodes=["edge-*"]
)
A = [f"edge-{i}" for i in range(5000)]
B = [f"edge-{i}" for i in range(2500, 7500)]  # half of A, half new


class FakeTunnel:
    peer = "127.0.0.1:1"

    def __init__(self) -> None:
        self.closed_with: tuple[CloseCode, str] | None = None

    def close(self, code: CloseCode, reason: str) -> None:
        self.closed_with = (code, reason)


def registry() -> Registry:
    return Registry([AGENT], TunnelMetrics(CollectorRegistry()))


def connect(reg: Registry) -> AgentSession:
    return reg.add(AGENT, cast(Tunnel, FakeTunnel()))


async def turns(work: Coroutine[Any, Any, None], each: Callable[[], None]) -> None:
    """Run ``work`` as a task, calling ``each`` after every loop turn until it is done."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.sleep(0)
        each()
    await task


def moves(sizes: list[int], start: int) -> list[int]:
    return [abs(b - a) for a, b in zip([start, *sizes], sizes, strict=False)]


async def test_a_registration_is_indexed_a_slice_per_turn() -> None:
    reg = registry()
    session = connect(reg)
    sizes: list[int] = []
    await turns(reg.registered(session, A, [], []), lambda: sizes.append(len(reg.node_index)))
    assert max(moves(sizes, 0)) <= CHECK_ENTRIES_PER_TURN
    assert len(sizes) >= len(A) // CHECK_ENTRIES_PER_TURN
    assert all(reg.agents_for(n) == [session] for n in A)
    assert session.nodes == set(A)


async def test_nodes_in_both_registrations_stay_routed_while_the_new_one_is_applied() -> None:
    reg = registry()
    session = connect(reg)
    await reg.registered(session, A, [], [])
    sizes: list[int] = []
    kept_routed: list[bool] = []

    def look() -> None:
        sizes.append(len(reg.node_index))
        kept_routed.append(all(reg.agents_for(n) == [session] for n in ("edge-2500", "edge-4999")))

    await turns(reg.registered(session, B, [], []), look)
    assert max(moves(sizes, len(A))) <= CHECK_ENTRIES_PER_TURN
    assert all(kept_routed)
    assert set(reg.node_index) == set(B) == session.nodes
    assert not reg.agents_for("edge-0")
    assert reg.is_known("edge-0")  # dropped, not forgotten: its TTL runs


async def test_a_registration_cancelled_halfway_leaves_nothing_behind() -> None:
    """A newer REGISTER cancels the one being applied: the next starts from what is
    indexed (``session.nodes``), so the index ends exactly at the newest set."""
    reg = registry()
    session = connect(reg)
    await reg.registered(session, A, [], [])
    task = asyncio.ensure_future(reg.registered(session, B, [], []))
    for _ in range(8):  # part of A dropped, part of B added
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert reg.node_index.keys() == session.nodes != set(B)
    c = [f"edge-{i}" for i in range(6000, 6100)]
    await reg.registered(session, c, [], [])
    assert set(reg.node_index) == set(c) == session.nodes


async def test_a_gone_session_is_never_routed_to_and_is_swept_a_slice_per_turn() -> None:
    reg = registry()
    session = connect(reg)
    await reg.registered(session, A, [], [])
    reg.remove(AGENT, session.tunnel)
    assert not any(reg.agents_for(n) for n in A)  # at once, before any sweeping
    assert reg.is_known("edge-0")
    sizes: list[int] = []
    while reg.node_index:
        await asyncio.sleep(0)
        sizes.append(len(reg.node_index))
    assert max(moves(sizes, len(A))) <= CHECK_ENTRIES_PER_TURN
    assert len(sizes) >= len(A) // CHECK_ENTRIES_PER_TURN
    assert set(reg.seen_nodes) == set(A)  # known for node_ttl_s, then forgotten


async def test_a_reconnect_during_the_sweep_keeps_its_own_nodes() -> None:
    """The old session's entries are swept by identity: the same agent's new session,
    registering the same names while the sweep runs, keeps every one of them."""
    reg = registry()
    old = connect(reg)
    await reg.registered(old, A, [], [])
    new = connect(reg)  # replaces ``old`` (closed REPLACED), whose entries are swept
    assert cast(FakeTunnel, old.tunnel).closed_with is not None
    await reg.registered(new, A, [], [])
    while any(old in serving for serving in reg.node_index.values()):
        await asyncio.sleep(0)
    assert all(reg.agents_for(n) == [new] for n in A)
    assert new.nodes == set(A) and not old.nodes


def test_without_a_running_loop_a_gone_session_is_unindexed_at_once() -> None:
    reg = registry()
    session = connect(reg)
    session.nodes.update(A[:10])
    for node in A[:10]:
        reg.node_index[node] = [session]
    reg.remove(AGENT, session.tunnel)
    assert not reg.node_index and not session.nodes
