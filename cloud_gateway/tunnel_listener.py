"""Accepts agents' tunnels: rate limit, handshake, registration, metrics, drain."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

from cloud_gateway.refusals import Refusals
from cloud_gateway.registry import AgentSession, Registry, check_registration_bounded
from cloud_gateway.websocket_listener import WebSocketServer
from raven.config.gateway import AuthorisedAgent, WebSocketConfig
from raven.hostport import parse_hostport
from raven.keys import key_id
from raven.protocol import events as ev
from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.connection import (
    HANDSHAKE_TIMEOUT_REASON,
    UNCONFIRMED_REASON,
    TunnelConnection,
)
from raven.protocol.cookie import CookieResponder
from raven.protocol.errors import BAD_RECORD_REASON, HANDSHAKE_REJECTIONS
from raven.protocol.handshake import ReplayGuard
from raven.protocol.limits import Limits
from raven.protocol.noise import public_key
from raven.protocol.ratelimit import RateLimiter
from raven.protocol.secure_channel import Role, SecureChannel
from raven.protocol.selftest import handshake_selftest
from raven.protocol.suites import DEFAULT_SUITES, Suite
from raven.telemetry.logs import doc_link, fields
from raven.telemetry.logthrottle import LogThrottle
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.deadlines import Deadlines
from raven.transport.tunnel import EventHandler, Tunnel, TunnelStream

log = logging.getLogger(__name__)

#: Why a tunnel that never authenticated was closed AUTH_FAILED, as handshake metric labels.
_UNAUTHENTICATED = HANDSHAKE_REJECTIONS | {HANDSHAKE_TIMEOUT_REASON, UNCONFIRMED_REASON}

#: Called when an agent's tunnel is up (session) or gone (None), e.g. to attach L3.
SessionHook = Callable[[AgentSession, bool], None]
#: Serves a stream an authenticated agent opened (backfill): session, stream, node, port.
AgentStreamService = Callable[[AgentSession, TunnelStream, str, int], Awaitable[None]]


class TunnelListener:
    """The gateway's tunnel port."""

    def __init__(
        self,
        *,
        listen: str,
        static_private: bytes,
        psk: bytes,
        limits: Limits,
        registry: Registry,
        metrics: TunnelMetrics,
        handshake_rate_per_s: float,
        handshake_burst: int,
        max_half_open: int = 1024,
        load_threshold: int = 64,
        suites: Sequence[Suite] = DEFAULT_SUITES,
        replica_id: str | None = None,
        replicas: int = 1,
        websocket: WebSocketConfig | None = None,
    ) -> None:
        self.host, self.port = parse_hostport(listen)
        self.static_private = static_private
        self.psk = psk
        self.limits = limits
        self.registry = registry
        self.metrics = metrics
        self.replay_guard = ReplayGuard(live=self._has_session)
        self.rate = RateLimiter(rate_per_s=handshake_rate_per_s, burst=handshake_burst)
        #: recent refusals per address and reason, for the status page and raven status
        self.refusals = Refusals()
        #: connections still in their handshake, over all sources, at most
        self.max_half_open = max_half_open
        #: handshakes in progress above which initiations must carry a cookie (0: always)
        self.load_threshold = load_threshold
        self.cookies = CookieResponder(public_key(static_private), under_load=self._under_load)
        #: transport suites agents may use (told to each in message 2)
        self.suites = tuple(suites)
        self.tunnels: set[Tunnel] = set()
        #: told to each agent that asks (ReplicaAsked): who this replica is, how many there are
        self.replica_id = replica_id or f"gateway-{secrets.token_hex(4)}"
        self.replicas = replicas
        self.log_throttle = LogThrottle(clock=time.monotonic)
        self.session_hooks: list[SessionHook] = []
        #: serves agent-opened streams (None: they are refused)
        self.agent_stream_service: AgentStreamService | None = None
        self._server: asyncio.Server | None = None
        #: the WebSocket tunnel port (websocket.listen), None when off
        self.websocket: WebSocketServer | None = None
        if websocket is not None and websocket.listen is not None:
            self.websocket = WebSocketServer(
                websocket, self._make_tunnel, timeout_s=limits.handshake_timeout_s,
                on_refused=lambda label: self.metrics.handshakes.labels(f"websocket_{label}").inc(),
            )  # fmt: skip
        #: one timer for every tunnel's deadlines (made by start, on the running loop)
        self._deadlines: Deadlines | None = None
        self.bound: tuple[str, int] | None = None
        self._sessions: dict[Tunnel, AgentSession] = {}
        #: agent key -> its tunnels here whose handshake completed (the replay guard's "live")
        self._confirmed: dict[bytes, int] = {}
        #: the registration being checked per tunnel (a newer one replaces it)
        self._checks: dict[Tunnel, asyncio.Task[None]] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # every accepted suite proven before the port opens (raven.protocol.selftest)
        handshake_selftest(
            self.static_private, psk=self.psk, suites=self.suites, limits=self.limits,
            now=loop.time(), wall_time_ns=time.time_ns(),
        )  # fmt: skip
        self._deadlines = Deadlines(loop)
        self._server = await loop.create_server(
            self._make_tunnel, self.host, self.port, reuse_address=True, backlog=1024
        )
        sock = self._server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("tunnel listener up addr=%s:%s", self.host, self.bound[1])
        if self.websocket is not None:
            await self.websocket.start()

    @functools.cached_property
    def _tunnel_hooks(
        self,
    ) -> tuple[Callable[[bytes], bool], Callable[[Tunnel], bool], EventHandler]:
        """What every tunnel is given (authorize, admit, on_event), bound once: reading a
        method off an object makes a new 64-byte bound method, which each of thousands of
        tunnels would keep."""
        return self.registry.authorize, self._admit, self._on_event

    def _make_tunnel(self) -> Tunnel:
        loop = asyncio.get_running_loop()
        authorize, admit, on_event = self._tunnel_hooks
        conn = TunnelConnection(
            SecureChannel(
                role=Role.RESPONDER,
                static_private=self.static_private,
                limits=self.limits,
                now=loop.time(),
                psk=self.psk,
                authorize=authorize,
                replay_guard=self.replay_guard,
                cookies=self.cookies,
                suites=self.suites,
            )
        )
        tunnel = Tunnel(conn, name="incoming", admit=admit, deadlines=self._deadlines)
        tunnel.on_event = on_event
        if self.agent_stream_service is not None:
            tunnel.streams.on_stream = functools.partial(self._agent_stream, tunnel)
        self.tunnels.add(tunnel)
        return tunnel

    async def _agent_stream(
        self, tunnel: Tunnel, stream: TunnelStream, node: str, port: int
    ) -> None:
        session = self._sessions.get(tunnel)
        if session is None or self.agent_stream_service is None:
            stream.refuse(StreamCode.UNKNOWN_NODE, "this side serves no streams")
            return
        await self.agent_stream_service(session, stream, node, port)

    def _has_session(self, public_key: bytes) -> bool:
        """Does this agent key have a confirmed tunnel here now (replay guard, strict)?
        Registered or not yet (a tunnel becomes the agent's session when it registers)."""
        return self._confirmed.get(public_key, 0) > 0

    def _half_open(self) -> int:
        return len(self.tunnels) - len(self._sessions)

    def _under_load(self) -> bool:
        """Cookie replies instead of DH above ``load_threshold`` handshakes in progress."""
        return self._half_open() > self.load_threshold

    def _admit(self, tunnel: Tunnel) -> bool:
        """Bound half-open handshakes globally and rate-limit them per source address,
        before reading a byte (the handshake's DH is the expensive part)."""
        if self._half_open() > self.max_half_open:
            self.metrics.handshakes.labels("overloaded").inc()
            self.log_throttle.log(
                log, logging.WARNING, "handshakes overloaded",
                "too many handshakes in progress, closing",
                extra=fields(peer=tunnel.peer, limit=self.max_half_open, reason="overloaded",
                             doc=doc_link("handshake", "overloaded")),
            )  # fmt: skip
            return False
        host = _peer_host(tunnel)
        if self.rate.allow(host, time.monotonic()):
            with contextlib.suppress(ValueError):  # no peer address: cookies bind to b""
                tunnel.conn.set_source_address(ipaddress.ip_address(host.strip("[]")).packed)
            return True
        self.metrics.handshakes.labels("rate_limited").inc()
        self.refusals.refused(host, "rate_limited")
        self.log_throttle.log(
            log,
            logging.WARNING,
            "handshake rate limited",
            "handshake rate limited",
            extra=fields(peer=tunnel.peer, reason="rate_limited",
                         doc=doc_link("handshake", "rate_limited")),
        )  # fmt: skip
        return False

    def _on_event(self, tunnel: Tunnel, event: ev.Event) -> None:
        if isinstance(event, ev.HandshakeCompleted):
            self._on_handshake(tunnel, event.remote_static)
        elif isinstance(event, ev.RegistrationReceived):
            session = self._sessions.get(tunnel)
            if session is not None:
                if not session.registered:
                    session = self._promote(tunnel, session)
                self._check_registration(tunnel, session, event)
        elif isinstance(event, ev.ReplicaAsked):
            if tunnel in self._sessions:
                tunnel.announce_replica(self.replica_id, self.replicas)
        elif isinstance(event, ev.PongReceived):
            session = self._sessions.get(tunnel)
            if session is not None:
                self.metrics.rtt_hist.observe(event.rtt_s)
        elif isinstance(event, ev.StreamReset):
            self.metrics.stream_resets.labels(event.code.label).inc()
        elif isinstance(event, ev.CookieReplied):
            self.metrics.cookie_replies.inc()
        elif isinstance(event, ev.ConnectionTerminated):
            self._on_closed(tunnel, event)

    def _check_registration(
        self, tunnel: Tunnel, session: AgentSession, event: ev.RegistrationReceived
    ) -> None:
        """Check the registration off the current loop turn, a bounded slice per turn;
        a newer registration from the same tunnel cancels an unfinished check."""
        pending = self._checks.pop(tunnel, None)
        if pending is not None:
            pending.cancel()
        task = asyncio.get_running_loop().create_task(
            self._register(tunnel, session, event.nodes, event.prefixes)
        )
        self._checks[tunnel] = task
        task.add_done_callback(lambda done: self._check_done(tunnel, done))

    def _check_done(self, tunnel: Tunnel, task: asyncio.Task[None]) -> None:
        if self._checks.get(tunnel) is task:
            del self._checks[tunnel]

    async def _register(
        self,
        tunnel: Tunnel,
        session: AgentSession,
        nodes: tuple[str, ...],
        prefixes: tuple[str, ...],
    ) -> None:
        ok_nodes, ok_prefixes, refused = await check_registration_bounded(
            session.agent, nodes, prefixes
        )
        if tunnel.closed.done():
            return
        await self.registry.registered(session, ok_nodes, ok_prefixes, refused)
        frames: list[bytes] = []
        for frame in tunnel.conn.registration_answer(ok_nodes, ok_prefixes, refused):
            frames.append(frame)
            await asyncio.sleep(0)  # one frame (~1,000 names) encoded per loop turn
        if tunnel.closed.done() or not self.registry.live(session):
            return
        tunnel.answer_registration(frames)
        for hook in self.session_hooks:
            hook(session, True)

    def _on_handshake(self, tunnel: Tunnel, remote_static: bytes) -> None:
        agent: AuthorisedAgent | None = self.registry.agent_for_key(remote_static)
        if agent is None:  # authorize() should have refused it already
            tunnel.close(CloseCode.AUTH_FAILED, "unknown key")
            return
        tunnel.name = agent.name
        self.metrics.handshakes.labels("ok").inc()
        session = AgentSession(agent=agent, tunnel=tunnel)
        self._sessions[tunnel] = session
        key = agent.public_key_bytes
        self._confirmed[key] = self._confirmed.get(key, 0) + 1
        # with a tunnel of this agent's up here, the new one replaces it only when it
        # registers: an agent that reached a replica it already holds (one address in front
        # of several replicas) closes the new tunnel first, and the held one is left alone
        if agent.name not in self.registry.sessions:
            self._promote(tunnel, session)

    def _promote(self, tunnel: Tunnel, pending: AgentSession) -> AgentSession:
        agent = pending.agent
        session = self.registry.add(agent, tunnel)
        session.connected_since = pending.connected_since
        session.registered = True
        self.refusals.authenticated(_peer_host(tunnel), session.agent.name)
        self._sessions[tunnel] = session
        self.metrics.live.tunnel_up(agent.name, tunnel)
        log.info(
            "tunnel up",
            extra=fields(site=agent.name, agent_key=key_id(agent.public_key), peer=tunnel.peer),
        )
        return session

    def _unauthenticated_closed(self, tunnel: Tunnel, event: ev.ConnectionTerminated) -> None:
        """A tunnel that never authenticated closed: one line, a metric, no answer given."""
        if event.code is CloseCode.AUTH_FAILED:
            # a rejection's reason is a label; anything else is a record that failed
            # authentication (free text, never a label value)
            label = event.reason if event.reason in _UNAUTHENTICATED else BAD_RECORD_REASON
            self.metrics.handshakes.labels(label).inc()
            self.refusals.refused(_peer_host(tunnel), label)
            level, key, msg = logging.WARNING, f"handshake rejected {label}", "handshake rejected"
        elif event.code is not CloseCode.LIMIT_EXCEEDED:
            label = "failed"
            self.metrics.handshakes.labels(label).inc()
            level, key, msg = logging.INFO, "handshake failed", "handshake failed"
        else:
            return
        extra = fields(peer=tunnel.peer, reason=event.reason, doc=doc_link("handshake", label))
        self.log_throttle.log(log, level, key, msg, extra=extra)

    def _on_closed(self, tunnel: Tunnel, event: ev.ConnectionTerminated) -> None:
        self.tunnels.discard(tunnel)
        check = self._checks.pop(tunnel, None)
        if check is not None:
            check.cancel()
        session = self._sessions.pop(tunnel, None)
        if session is not None:
            key = session.agent.public_key_bytes
            if self._confirmed.get(key, 0) <= 1:
                self._confirmed.pop(key, None)
            else:
                self._confirmed[key] -= 1
        if session is None:
            self._unauthenticated_closed(tunnel, event)
            return
        if not session.registered:  # e.g. an agent that already holds this replica
            log.debug(
                "tunnel closed before registering",
                extra=fields(site=session.agent.name, peer=tunnel.peer, reason=event.reason),
            )
            return
        self.metrics.live.tunnel_down(session.agent.name, tunnel)
        self.metrics.tunnel_closes.labels(event.code.label).inc()
        self.registry.remove(session.agent, tunnel)
        for hook in self.session_hooks:
            hook(session, False)
        log.info(
            "tunnel down",
            extra=fields(
                site=session.agent.name,
                agent_key=key_id(session.agent.public_key),
                peer=tunnel.peer,
                code=event.code.label,
                reason=event.reason,
                doc=doc_link("close", event.code.label),
                duration_s=round(time.time() - session.connected_since, 3),
            ),
        )

    def announce_replicas(self, replicas: int) -> None:
        """The replica count changed: tell every agent that asked."""
        self.replicas = replicas
        for tunnel in list(self._sessions):
            if tunnel.conn.replica_asked and not tunnel.closed.done():
                tunnel.announce_replica(self.replica_id, replicas)

    def stop_accepting(self) -> None:
        """Refuse new tunnels (shutting down); the ones up carry on until :meth:`drain`."""
        if self._server is not None:
            self._server.close()
        if self.websocket is not None:
            self.websocket.stop_accepting()

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, send GOAWAY on every tunnel, let streams finish, then close."""
        self.stop_accepting()
        tunnels = list(self.tunnels)
        for t in tunnels:
            t.go_away("gateway shutting down")
        if tunnels:
            await asyncio.gather(*(t.streams.wait_done(timeout_s) for t in tunnels))
        for t in tunnels:
            t.close(CloseCode.DRAINED, "gateway shut down")
            await t.aclose()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self.websocket is not None:
            await self.websocket.wait_closed()
        if self._deadlines is not None:
            self._deadlines.close()


def _peer_host(tunnel: Tunnel) -> str:
    """The tunnel's peer address without its port (an IPv6 one keeps its brackets)."""
    return tunnel.peer.rsplit(":", 1)[0]
