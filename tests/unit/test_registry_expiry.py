"""Nodes no agent serves are forgotten node_ttl_s after their last agent dropped them.

Expiry reads only the nodes due (the unserved ones are kept oldest first), not every node
ever seen: at 60,000 nodes the full walk held the gateway's loop ~10 ms each time. The
result must be what the full walk gave; an oracle written as that walk checks it over random
sequences of registrations, drops and clock steps. "Known" (no_agent rather than
unknown_node) also takes the configuration's exact names, from a set built when the
configuration is (re)loaded, not a walk over every agent's patterns per request.
"""

from __future__ import annotations

import asyncio
import base64
from typing import cast

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cloud_gateway.registry import AgentSession, Registry
from raven.config.gateway import AuthorisedAgent
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.tunnel import Tunnel

TTL = 100.0


def agent(name: str, key: int, nodes: list[str]) -> AuthorisedAgent:
    public_key = base64.b64encode(bytes([key]) * 32).decode()
    return AuthorisedAgent(name=name, public_key=public_key, nodes=nodes)


SITE = agent("site-a", 1, ["edge-*", "Exact-Node"])
OTHER = agent("site-b", 2, ["gpu-*"])


class FakeTunnel:
    peer = "127.0.0.1:1"

    def close(self, code: object, reason: str) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock) -> Registry:
    return Registry([SITE, OTHER], TunnelMetrics(CollectorRegistry()), node_ttl_s=TTL, clock=clock)


def oracle(reg: Registry, now: float) -> set[str]:
    """The nodes the full walk forgot: seen, not served, last served at least TTL ago."""
    horizon = now - TTL
    return {
        n for n, since in reg.seen_nodes.items() if since <= horizon and n not in reg.node_index
    }


def register(reg: Registry, session: AgentSession, nodes: list[str]) -> None:
    asyncio.run(reg.registered(session, nodes, [], []))


def test_a_dropped_node_is_forgotten_ttl_after_its_drop_and_a_served_one_never() -> None:
    clock = Clock()
    reg = registry(clock)
    session = reg.add(SITE, cast(Tunnel, FakeTunnel()))
    register(reg, session, ["edge-1", "edge-2", "edge-3"])
    clock.now += 10
    register(reg, session, ["edge-2", "edge-3"])  # edge-1 dropped at +10
    clock.now += 10
    register(reg, session, ["edge-3"])  # edge-2 dropped at +20
    clock.now += TTL - 10  # +110: edge-1 is due, edge-2 not yet
    assert reg.expire() == ["edge-1"]
    assert reg.is_known("edge-2") and not reg.is_known("edge-1")
    clock.now += 10
    assert reg.expire() == ["edge-2"]
    clock.now += 10 * TTL
    assert reg.expire() == []  # edge-3 is served
    assert reg.agents_for("edge-3") == [session]


def test_a_node_served_again_and_dropped_again_counts_from_the_second_drop() -> None:
    clock = Clock()
    reg = registry(clock)
    session = reg.add(SITE, cast(Tunnel, FakeTunnel()))
    register(reg, session, ["edge-1", "edge-2"])
    register(reg, session, ["edge-2"])  # edge-1 dropped at 0
    clock.now += 50
    register(reg, session, ["edge-1", "edge-2"])  # served again
    clock.now += 10
    register(reg, session, ["edge-2"])  # dropped again at +60
    clock.now += TTL - 1
    assert reg.expire() == []
    clock.now += 1
    assert reg.expire() == ["edge-1"]


def test_expiry_holds_only_the_unserved_nodes() -> None:
    clock = Clock()
    reg = registry(clock)
    session = reg.add(SITE, cast(Tunnel, FakeTunnel()))
    nodes = [f"edge-{i}" for i in range(20_000)]
    register(reg, session, nodes)
    register(reg, session, nodes[1:])
    assert list(reg._unserved) == ["edge-0"]  # what an expiry reads, not 20,000 names


def test_the_configurations_exact_names_are_known_and_follow_a_reload() -> None:
    reg = registry(Clock())
    assert reg.is_known("exact-node")  # names are compared lower-cased
    assert not reg.is_known("edge-1")  # a glob makes nothing known before it is served
    reg.update_agents([OTHER, agent("site-c", 3, ["new-exact"])])
    assert reg.is_known("new-exact") and not reg.is_known("exact-node")


OPS = st.lists(
    st.tuples(
        st.sampled_from(["register", "drop_session", "tick"]),
        st.sampled_from([SITE, OTHER]),
        st.sets(st.integers(0, 7), max_size=8),
        st.floats(0, TTL * 0.7),
    ),
    max_size=40,
)


@given(OPS)
def test_expiry_forgets_what_the_full_walk_forgot(
    ops: list[tuple[str, AuthorisedAgent, set[int], float]],
) -> None:
    clock = Clock()
    reg = registry(clock)
    sessions: dict[str, AgentSession] = {}
    for op, who, indexes, step in ops:
        prefix = "edge" if who is SITE else "gpu"
        if op == "register":
            session = sessions.get(who.name)
            if session is None or not reg.live(session):
                session = sessions[who.name] = reg.add(who, cast(Tunnel, FakeTunnel()))
            register(reg, session, [f"{prefix}-{i}" for i in sorted(indexes)])
        elif op == "drop_session" and who.name in sessions:
            reg.remove(who, sessions.pop(who.name).tunnel)
        else:
            clock.now += step
        expected = oracle(reg, clock.now)
        assert set(reg.expire()) == expected
        assert not oracle(reg, clock.now)


def test_a_node_its_site_covers_is_no_agent_naming_the_site_not_unknown() -> None:
    """A node an authorised site's patterns cover, whose agent is not connected (a wrong key,
    a site down): 503 no_agent naming the site, not 404 unknown_node (which says typo)."""
    from raven.transport.stream import OpenFailure, StreamOpenError

    reg = registry(Clock())

    async def open_(node: str) -> StreamOpenError:
        try:
            await reg.open_stream(node, 9400, timeout_s=1)
        except StreamOpenError as exc:
            return exc
        raise AssertionError("opened")

    covered = asyncio.run(open_("edge-gpu-7"))  # SITE's glob edge-*, never registered
    assert covered.reason is OpenFailure.NO_AGENT and "site site-a is down" in covered.detail
    exact = asyncio.run(open_("exact-node"))  # an exact name in the config, case-folded
    assert exact.reason is OpenFailure.NO_AGENT and "site-a" in exact.detail
    stranger = asyncio.run(open_("nope-1"))
    assert stranger.reason is OpenFailure.UNKNOWN_NODE
    assert reg.down_sites_covering("gpu-3") == ["site-b"] and not reg.down_sites_covering("x")
