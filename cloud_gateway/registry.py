"""The agent registry: which connected agent serves which node, and the StreamOpener over it.

Authorisation is by key: an agent's registration is checked against the node patterns
and prefixes configured for its public key; anything beyond is refused, reported back
to the agent and counted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from raven.config.gateway import AuthorisedAgent
from raven.keys import encode_key, key_id
from raven.protocol.codes import CloseCode
from raven.protocol.names import node_name_error, normalize_node_name
from raven.telemetry.logs import fields
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.stream import OpenFailure, StreamOpenError
from raven.transport.tunnel import Tunnel, TunnelStream

log = logging.getLogger(__name__)

#: How long a node no agent serves any more stays known (default of node_ttl_s).
DEFAULT_NODE_TTL_S = 3600.0

#: Registration entries validated, indexed or unindexed per event-loop turn: a large (or
#: hostile) registration never holds the loop that serves every other site for more than
#: about a millisecond (a full one, 16,384 names, held it up to 148 ms in one turn before).
CHECK_ENTRIES_PER_TURN = 256

#: Open failures after which the next agent serving the same node is tried.
_TRY_NEXT = {OpenFailure.BUSY, OpenFailure.DRAINING, OpenFailure.TUNNEL_CLOSED}


@dataclass(eq=False, slots=True)  # compared by identity: the node index holds sessions
class AgentSession:
    """One live tunnel from an authorised agent."""

    agent: AuthorisedAgent
    tunnel: Tunnel
    connected_since: float = field(default_factory=time.time)
    #: the nodes routed to this session right now (a registration is indexed a slice per
    #: loop turn, so during one this is part old, part new set)
    nodes: set[str] = field(default_factory=set)
    prefixes: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    #: the tunnel registered (it is, or was, the agent's session in the registry)
    registered: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "agent": self.agent.name,
            "public_key": self.agent.public_key,
            "remote_address": self.tunnel.peer,
            "connected_since": iso_utc(self.connected_since),
            "rtt_seconds": self.tunnel.rtt_s,
            "suite": suite.label if (suite := self.tunnel.conn.suite) is not None else None,
            "nodes": sorted(self.nodes),
            "prefixes": list(self.prefixes),
            "refused": [{"entry": e, "reason": r} for e, r in self.refused],
            "open_streams": len(self.tunnel.streams),
            "draining": self.tunnel.draining,
        }


def iso_utc(ts: float) -> str:
    """A wall time as the admin API writes it: ISO 8601 UTC, whole seconds."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_registration(
    agent: AuthorisedAgent, nodes: tuple[str, ...], prefixes: tuple[str, ...]
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Split a registration into (accepted nodes, accepted prefixes, refused with reasons)."""
    ok_nodes: list[str] = []
    ok_prefixes: list[str] = []
    refused: list[tuple[str, str]] = []
    allowed_nets = [ipaddress.ip_network(p) for p in agent.prefixes]
    for raw in nodes:
        name = normalize_node_name(raw)
        error = node_name_error(raw)
        if error is not None:
            refused.append((raw, f"not a valid node name: {error}"))
        elif not agent.may_serve(name):
            refused.append((raw, "not authorised for this agent key"))
        else:
            ok_nodes.append(name)
    for raw in prefixes:
        try:
            net = ipaddress.ip_network(raw, strict=True)
        except ValueError:
            refused.append((raw, "not an IP prefix"))
            continue
        if any(net.version == a.version and net.subnet_of(a) for a in allowed_nets):  # type: ignore[arg-type]
            ok_prefixes.append(str(net))
        else:
            refused.append((raw, "prefix not authorised for this agent key"))
    return ok_nodes, ok_prefixes, refused


async def check_registration_bounded(
    agent: AuthorisedAgent, nodes: tuple[str, ...], prefixes: tuple[str, ...]
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """:func:`check_registration`, at most CHECK_ENTRIES_PER_TURN entries per loop turn."""
    ok_nodes: list[str] = []
    ok_prefixes: list[str] = []
    refused: list[tuple[str, str]] = []
    step = CHECK_ENTRIES_PER_TURN
    for start in range(0, len(nodes), step):
        n, _, r = check_registration(agent, nodes[start : start + step], ())
        ok_nodes += n
        refused += r
        await asyncio.sleep(0)
    for start in range(0, len(prefixes), step):
        _, p, r = check_registration(agent, (), prefixes[start : start + step])
        ok_prefixes += p
        refused += r
        await asyncio.sleep(0)
    return ok_nodes, ok_prefixes, refused


class Registry:
    """Live agents and node routing; implements StreamOpener."""

    def __init__(
        self,
        agents: list[AuthorisedAgent],
        metrics: TunnelMetrics,
        on_change: Callable[[], None] | None = None,
        *,
        node_ttl_s: float = DEFAULT_NODE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.by_key: dict[bytes, AuthorisedAgent] = {}
        #: the exact (non-glob) node names of the configuration, lower-cased
        self._exact_names: frozenset[str] = frozenset()
        self._set_agents(agents)
        self.metrics = metrics
        self.sessions: dict[str, AgentSession] = {}  # agent name -> session
        #: node -> sessions serving it; a session replaced or gone stays listed until its
        #: nodes are unindexed (a slice per loop turn) but is never routed to
        self.node_index: dict[str, list[AgentSession]] = {}
        self._retiring: deque[AgentSession] = deque()
        self._sweeper: asyncio.Task[None] | None = None
        #: node -> when it was last served (clock): a node no agent serves stays known
        #: (no_agent, not unknown_node) for node_ttl_s, then is forgotten
        self.seen_nodes: dict[str, float] = {}
        #: the nodes no agent serves, oldest first (node -> since when): expiry reads only the
        #: ones due, not every node seen
        self._unserved: dict[str, float] = {}
        self.on_change = on_change
        #: called with the nodes just forgotten (e.g. to drop their metric series)
        self.on_forget: Callable[[list[str]], None] | None = None
        self.node_ttl_s = node_ttl_s
        self._clock = clock
        self._next_expiry = clock() + node_ttl_s / 16
        #: bumped on every change of sessions or nodes: views derived from them (the http_sd
        #: body) are cached per generation
        self.generation = 0

    def update_agents(self, agents: list[AuthorisedAgent]) -> list[AgentSession]:
        """Replace the authorised agents (config reload). Returns the live sessions whose
        key was removed or whose authorisation changed: the caller closes them, and the
        agent reconnects and registers again under the new rules."""
        self._set_agents(agents)
        stale = []
        for session in self.sessions.values():
            current = self.by_key.get(session.agent.public_key_bytes)
            if current != session.agent:
                stale.append(session)
        self._changed()
        return stale

    def _set_agents(self, agents: list[AuthorisedAgent]) -> None:
        self.by_key = {a.public_key_bytes: a for a in agents}
        self._exact_names = frozenset(
            pat.lower() for a in agents for pat in a.nodes if not _is_glob(pat)
        )

    # ------------------------------------------------------------ identity
    def authorize(self, public_key: bytes) -> bool:
        return public_key in self.by_key

    def agent_for_key(self, public_key: bytes) -> AuthorisedAgent | None:
        return self.by_key.get(public_key)

    # ------------------------------------------------------------ sessions
    def add(self, agent: AuthorisedAgent, tunnel: Tunnel) -> AgentSession:
        """A tunnel from ``agent`` finished its handshake. A previous one is replaced."""
        old = self.sessions.get(agent.name)
        session = AgentSession(agent=agent, tunnel=tunnel)
        self.sessions[agent.name] = session
        if old is not None and old.tunnel is not tunnel:
            log.info(
                "tunnel replaced",
                extra=fields(site=agent.name, agent_key=key_id(agent.public_key),
                             old_peer=old.tunnel.peer, peer=tunnel.peer),
            )  # fmt: skip
            self._retire(old)
            old.tunnel.close(CloseCode.REPLACED, "replaced by a newer tunnel from the same key")
        self._changed()
        return session

    def remove(self, agent: AuthorisedAgent, tunnel: Tunnel) -> None:
        session = self.sessions.get(agent.name)
        if session is None or session.tunnel is not tunnel:
            return
        del self.sessions[agent.name]
        self._retire(session)
        self._changed()

    def live(self, session: AgentSession) -> bool:
        return self.sessions.get(session.agent.name) is session

    async def registered(
        self,
        session: AgentSession,
        ok_nodes: list[str],
        ok_prefixes: list[str],
        refused: list[tuple[str, str]],
    ) -> None:
        """Apply a checked registration (:func:`check_registration_bounded`), replacing
        the earlier one: nodes it drops are unindexed, then new ones indexed, at most
        CHECK_ENTRIES_PER_TURN per loop turn (nodes in both stay routed throughout).
        Stops where it is when the session ends or the task is cancelled (a newer
        registration): ``session.nodes`` always says what is indexed."""
        wanted = set(ok_nodes)
        dropped, added = list(session.nodes - wanted), list(wanted - session.nodes)
        now = self._clock()
        for start in range(0, len(dropped), CHECK_ENTRIES_PER_TURN):
            for node in dropped[start : start + CHECK_ENTRIES_PER_TURN]:
                self._unindex_node(session, node, now)
            await asyncio.sleep(0)
        for start in range(0, len(added), CHECK_ENTRIES_PER_TURN):
            if not self.live(session):
                return
            for node in added[start : start + CHECK_ENTRIES_PER_TURN]:
                session.nodes.add(node)
                self.node_index.setdefault(node, []).append(session)
                self.seen_nodes[node] = now
                self._unserved.pop(node, None)
            await asyncio.sleep(0)
        if not self.live(session):
            return
        if refused:
            self.metrics.registrations_refused.labels(session.agent.name).inc(len(refused))
            log.warning(
                "registration refused",
                extra=fields(site=session.agent.name, agent_key=key_id(session.agent.public_key),
                             count=len(refused), entry=refused[0][0], reason=refused[0][1]),
            )  # fmt: skip
        session.prefixes = tuple(ok_prefixes)
        session.refused = tuple(refused)
        log.info(
            "agent registered",
            extra=fields(site=session.agent.name, nodes=len(ok_nodes),
                         prefixes=len(ok_prefixes), refused=len(refused)),
        )  # fmt: skip
        self._changed()

    def _unindex_node(self, session: AgentSession, node: str, now: float) -> None:
        session.nodes.discard(node)
        serving = self.node_index.get(node)
        if serving and session in serving:
            serving.remove(session)
            if not serving:
                del self.node_index[node]
                self.seen_nodes[node] = now  # the TTL runs from here
                self._unserved.pop(node, None)  # (re)inserted last: the dict stays in time order
                self._unserved[node] = now

    def _retire(self, session: AgentSession) -> None:
        """Unindex a session no longer in ``sessions`` (so never routed to again): a slice
        per loop turn in the background, or at once when no loop runs."""
        self._retiring.append(session)
        if self._sweeper is not None and not self._sweeper.done():
            return
        try:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        except RuntimeError:  # no running loop
            self._sweeper = None
            while self._retiring:
                self._sweep_slice(len(self._retiring[0].nodes))

    async def _sweep(self) -> None:
        while self._retiring:
            self._sweep_slice(CHECK_ENTRIES_PER_TURN)
            await asyncio.sleep(0)

    def _sweep_slice(self, count: int) -> None:
        session, now = self._retiring[0], self._clock()
        for node in list(itertools.islice(session.nodes, count)):
            self._unindex_node(session, node, now)
        if not session.nodes:
            self._retiring.popleft()

    def _changed(self) -> None:
        self.generation += 1
        if self._clock() >= self._next_expiry:
            self.expire()
        if self.on_change is not None:
            self.on_change()

    def expire(self) -> list[str]:
        """Forget the nodes no agent has served for node_ttl_s (they become unknown and
        their per-node series go); returns them. Runs by itself on registry changes."""
        now = self._clock()
        self._next_expiry = now + self.node_ttl_s / 16
        horizon = now - self.node_ttl_s
        gone = []
        for node, since in self._unserved.items():
            if since > horizon:
                break  # the rest became unserved later
            gone.append(node)
        for node in gone:
            del self._unserved[node]
            del self.seen_nodes[node]
        if gone and self.on_forget is not None:
            self.on_forget(gone)
        return gone

    # ------------------------------------------------------------ routing
    def agents_for(self, node: str) -> list[AgentSession]:
        return [s for s in self.node_index.get(node, ()) if self.live(s)]

    def down_sites_covering(self, node: str) -> list[str]:
        """The configured sites whose node patterns (names or globs) cover ``node`` and whose
        agent has no live tunnel (a connected site that does not serve it: unknown there)."""
        return sorted(
            a.name for a in self.by_key.values() if a.may_serve(node) and not self._is_up(a.name)
        )

    def _is_up(self, site: str) -> bool:
        session = self.sessions.get(site)
        return session is not None and self.live(session)

    def is_known(self, node: str) -> bool:
        """A node some agent registered once, or an exact (non-glob) name in the config."""
        return node in self.seen_nodes or node in self._exact_names

    async def open_stream(
        self, node: str, port: int, *, timeout_s: float, data: bytes = b""
    ) -> TunnelStream:
        """Open a stream to ``node``:``port`` through an agent serving it (``data`` rides
        with the OPEN; a refused agent's next candidate gets it again)."""
        name = normalize_node_name(node)
        candidates = self.agents_for(name)
        if not candidates:
            sites = self.down_sites_covering(name)
            if sites:  # a node its site's patterns cover: that site is down, not a typo
                down = ", ".join(sites)
                raise StreamOpenError(
                    OpenFailure.NO_AGENT, f"no agent connected for {name} (site {down} is down)"
                )
            if self.is_known(name):
                raise StreamOpenError(OpenFailure.NO_AGENT, f"no agent connected for {name}")
            raise StreamOpenError(OpenFailure.UNKNOWN_NODE, f"unknown node {name}")
        # least loaded first, then lowest RTT
        candidates.sort(
            key=lambda s: (s.tunnel.draining, len(s.tunnel.streams), s.tunnel.rtt_s or 0)
        )
        last: StreamOpenError | None = None
        for session in candidates:
            try:
                stream = await session.tunnel.open_stream(
                    name, port, timeout_s=timeout_s, data=data
                )
            except StreamOpenError as exc:
                if exc.reason not in _TRY_NEXT:
                    raise
                last = exc
                continue
            self.metrics.streams_opened.labels(session.agent.name).inc()
            return stream
        assert last is not None
        if last.reason is OpenFailure.TUNNEL_CLOSED:
            raise StreamOpenError(OpenFailure.NO_AGENT, f"no agent connected for {name}")
        raise last

    # ------------------------------------------------------------ API views
    def agents_json(self) -> dict[str, object]:
        return {"agents": [s.to_json() for _, s in sorted(self.sessions.items())]}

    def nodes_json(self) -> dict[str, object]:
        out = []
        self.expire()
        for node in sorted(self.seen_nodes.keys() | self.node_index.keys()):
            sessions = self.agents_for(node)
            out.append(
                {
                    "node": node,
                    "reachable": bool(sessions),
                    "agents": [
                        {
                            "agent": s.agent.name,
                            "connected_since": iso_utc(s.connected_since),
                            "rtt_seconds": s.tunnel.rtt_s,
                        }
                        for s in sessions
                    ],
                }
            )
        return {"nodes": out}

    def targets_json(self, port: int) -> list[dict[str, object]]:
        """Prometheus http_sd: every reachable node at ``port``."""
        out: list[dict[str, object]] = []
        for node in sorted(self.node_index):
            sessions = self.agents_for(node)
            if not sessions:
                continue
            out.append(
                {
                    "targets": [f"{node}:{port}"],
                    "labels": {
                        "node": node,
                        "agent": ",".join(sorted(s.agent.name for s in sessions)),
                        "__meta_raven_agent": sessions[0].agent.name,
                    },
                }
            )
        return out

    def public_keys(self) -> dict[str, str]:
        return {a.name: encode_key(k) for k, a in self.by_key.items()}


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")
