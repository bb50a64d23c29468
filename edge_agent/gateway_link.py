"""One link of the agent to one gateway address: dial out (TCP, or through a proxy, TLS and
WebSocket: raven.transport.gateway_connect), handshake, ask which replica it reached, register,
serve until the tunnel dies, then reconnect with exponential backoff and full jitter (fast
jittered probes while the path is broken). Which replicas to hold is the pool's business
(:class:`ReplicaPool`, implemented by edge_agent.dialer.Dialer).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from raven.protocol import events as ev
from raven.protocol.codes import CloseCode
from raven.protocol.connection import TunnelConnection
from raven.protocol.cookie import CookieJar
from raven.protocol.limits import Limits
from raven.protocol.secure_channel import Role, SecureChannel
from raven.protocol.suites import DEFAULT_SUITE, DEFAULT_SUITES, Suite, first_suite
from raven.runtime.backoff import backoff_delay
from raven.telemetry.logs import doc_link, fields
from raven.telemetry.metrics import TunnelMetrics
from raven.transport.gateway_connect import GatewayTransport, TransportFailed, connect_tunnel
from raven.transport.tunnel import StreamHandler, Tunnel

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

#: A link that stayed up this long resets its backoff.
STABLE_AFTER_S = 10.0


@dataclass(frozen=True)
class DialSettings:
    static_private: bytes
    gateway_public: bytes
    psk: bytes
    limits: Limits
    min_backoff_s: float
    max_backoff_s: float
    #: after a tunnel was lost and while the path stays broken: retry at most this far apart
    #: (full jitter) and give each TCP connect twice this (see ReconnectConfig)
    probe_s: float = 1.0
    probe_for_s: float = 900.0
    #: transport suites offered, in order of preference (AgentConfig.transport_suites)
    suites: tuple[Suite, ...] = DEFAULT_SUITES
    #: largest delay between dials that land on replicas already held (ReconnectConfig)
    replica_retry_max_s: float = 5.0
    #: duplicates in a row after which those dials are spaced by max_backoff_s
    replica_search_attempts: int = 30
    #: TLS/WebSocket and forward proxy between the agent and the gateway (None: plain TCP)
    transport: GatewayTransport | None = None


class DuplicateReplica(Exception):
    """The tunnel reached a gateway replica another link already holds."""


class ReplicaPool(Protocol):
    """What a link asks of the dialer about the replicas held (the Dialer implements it)."""

    def claim(self, link: GatewayLink) -> bool:
        """``link`` reached ``link.replica_id``: True to keep it, False when another link
        holds that replica."""
        ...

    def release(self, link: GatewayLink) -> None:
        """``link`` no longer holds a replica (tunnel down or draining)."""
        ...

    def surplus(self, link: GatewayLink) -> bool:
        """``link`` found a duplicate and is not needed any more: it stops."""
        ...

    def counted(self, link: GatewayLink) -> None:
        """``link`` heard a new replica count."""
        ...


#: Errors that say the network path is broken, not that a gateway answered (refused, busy).
_PATH_ERRNOS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN}


def path_broken(exc: BaseException) -> bool:
    """True when nothing reached the gateway: the connect timed out or had no route."""
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS


def probe_delay(probe_s: float, rng: random.Random) -> float:
    """Delay of a recovery probe: uniform in [probe_s / 20, probe_s] (full jitter, so agents
    returning together spread over the whole window)."""
    return rng.uniform(probe_s / 20, probe_s)


class GatewayLink:
    """Keeps one tunnel up to one gateway replica address."""

    def __init__(
        self,
        address: str,
        port: int,
        settings: DialSettings,
        *,
        on_stream: StreamHandler,
        registration: Callable[[], tuple[list[str], list[str]]],
        metrics: TunnelMetrics,
        on_tunnel: Callable[[GatewayLink, Tunnel | None], None] | None = None,
        on_datagram: Callable[[bytes], None] | None = None,
        rng: random.Random | None = None,
        pool: ReplicaPool | None = None,
    ) -> None:
        self.address = address
        self.port = port
        self.settings = settings
        self.on_stream = on_stream
        self.registration = registration
        self.metrics = metrics
        self.on_tunnel = on_tunnel
        self.on_datagram = on_datagram
        self.rng = rng or random.Random()
        #: the gateway replica's last cookie (under load), kept across reconnects for 120 s
        self.cookie_jar = CookieJar()
        self.tunnel: Tunnel | None = None
        self.attempt = 0
        self.connects = 0
        self.last_error = ""
        self.accepted_nodes: tuple[str, ...] = ()
        self.refused: tuple[tuple[str, str], ...] = ()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: since when the path is believed broken: the last tunnel's loss, or the link's start
        #: (an agent started during an outage probes fast too, until a gateway answers)
        self._lost_at: float | None = None
        #: the suites this gateway accepted last time (None: not connected yet)
        self.peer_suites: frozenset[Suite] | None = None
        #: the replicas held by the agent (None: this link keeps whatever it reaches)
        self.pool = pool
        #: the replica the current tunnel reached and the count it announced (REPLICA)
        self.replica_id: str | None = None
        self.replicas = 0
        #: this link holds its replica (claimed in the pool and not draining)
        self.holds = False
        #: dials in a row that reached a replica already held
        self.duplicates = 0
        self._announced: asyncio.Future[None] | None = None
        #: the forward proxy the last attempt went through ("" when direct)
        self.via = ""

    @property
    def label(self) -> str:
        return (
            f"[{self.address}]:{self.port}"
            if ":" in self.address
            else f"{self.address}:{self.port}"
        )

    def start(self) -> None:
        self._lost_at = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"link {self.label}")

    async def stop(self, *, graceful: bool = True) -> None:
        self._stopping = True
        if self.tunnel is not None and graceful:
            self.tunnel.go_away("agent shutting down")
            await self.tunnel.streams.wait_done(self.settings.limits.drain_timeout_s)
        if self.tunnel is not None:
            await self.tunnel.aclose()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def reregister(self) -> None:
        if self.tunnel is not None and not self.tunnel.closed.done():
            nodes, prefixes = self.registration()
            self.tunnel.register(nodes, prefixes)

    def _probing(self) -> bool:
        lost = self._lost_at
        return lost is not None and time.monotonic() - lost < self.settings.probe_for_s

    async def _run(self) -> None:
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._connect_once()
            except DuplicateReplica:
                if self.pool is not None and self.pool.surplus(self):
                    self._stopping = True
                    return
                await asyncio.sleep(self._duplicate_delay())
                continue
            except (OSError, ConnectionError, TimeoutError) as exc:
                self.last_error = str(exc) or type(exc).__name__
                log.warning(
                    "gateway link failed", extra=fields(gateway=self.label, reason=self.last_error)
                )
                if not path_broken(exc):
                    self._lost_at = None  # a gateway answered: ordinary backoff from here
            if self._stopping:
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                self.attempt = 0
            if self._probing():
                # the link was up and the path broke: probe fast (jittered) so scrapes
                # resume within seconds of the path returning
                delay = probe_delay(self.settings.probe_s, self.rng)
            else:
                delay = backoff_delay(
                    self.attempt, self.settings.min_backoff_s, self.settings.max_backoff_s, self.rng
                )
                self.attempt += 1
            log.info(
                "reconnecting",
                extra=fields(gateway=self.label, delay_s=round(delay, 2), attempt=self.attempt),
            )
            await asyncio.sleep(delay)

    def _duplicate_delay(self) -> float:
        """Delay before dialling again after reaching a replica already held. A random dial
        finds a missing one of N replicas once in N tries or so: the first
        ``2 * replicas`` such dials in a row wait a jittered ``min_backoff_s`` at most (an
        agent holds 8 replicas within seconds), the next ones back off exponentially up to
        ``replica_retry_max_s``, and after ``replica_search_attempts`` (at least 6 per replica) up
        to ``max_backoff_s``, with a warning (a balancer pinning every dial to one replica)."""
        settings, k = self.settings, self.duplicates
        # one missing replica of N is found once in N random dials: the cap grows with N
        limit = max(settings.replica_search_attempts, 6 * self.replicas)
        if k == limit:
            log.warning(
                "still missing gateway replicas behind one address",
                extra=fields(gateway=self.label, dials=k,
                             hint="session affinity on the load balancer?"),
            )  # fmt: skip
        if k >= limit:
            return backoff_delay(k, settings.min_backoff_s, settings.max_backoff_s, self.rng)
        quick = 2 * max(self.replicas, 1)
        if k <= quick:
            return self.rng.uniform(settings.min_backoff_s / 10, settings.min_backoff_s)
        return backoff_delay(k - quick, settings.min_backoff_s, settings.replica_retry_max_s,
                             self.rng)  # fmt: skip

    def _new_connection(self, now: float) -> TunnelConnection:
        """The sans-IO tunnel of one attempt: its suite follows what this gateway accepted
        last time (``peer_suites``), its message 1 the cookie it sent (``cookie_jar``)."""
        settings = self.settings
        return TunnelConnection(
            SecureChannel(
                role=Role.INITIATOR,
                static_private=settings.static_private,
                remote_static=settings.gateway_public,
                psk=settings.psk,
                limits=settings.limits,
                now=now,
                wall_time_ns=time.time_ns(),
                cookie_jar=self.cookie_jar,
                suites=settings.suites,
                peer_suites=self.peer_suites,
            )
        )

    async def _connect_once(self) -> None:
        loop = asyncio.get_running_loop()
        offered = first_suite(self.settings.suites, self.peer_suites)
        conn = self._new_connection(loop.time())
        tunnel = Tunnel(
            conn, on_stream=self.on_stream, on_datagram=self.on_datagram, name=self.label
        )
        tunnel.on_event = self._on_event
        connect_s = self.settings.limits.handshake_timeout_s
        if self._probing():
            connect_s = min(connect_s, 2 * self.settings.probe_s)
        async with asyncio.timeout(self.settings.limits.handshake_timeout_s):
            async with asyncio.timeout(connect_s):
                await self._open(tunnel)
            try:
                await tunnel.handshake
            except ConnectionError as exc:
                self.metrics.handshakes.labels("failed").inc()
                # the gateway may have stopped accepting the suite it accepted last time: the
                # next attempt starts from the default
                self.peer_suites = None
                # the gateway answers nothing useful on purpose; say what it most likely means
                raise ConnectionError(
                    f"{exc}: {handshake_refusal_hint(exc, offered.label)}"
                ) from None
        self.metrics.handshakes.labels("ok").inc()
        self.peer_suites = conn.peer_suites
        await self._learn_replica(tunnel)
        self.tunnel = tunnel
        self.connects += 1
        self.metrics.live.tunnel_up(self.label, tunnel)
        log.info("tunnel up", extra=fields(gateway=self.label, replica=self.replica_id))
        self.reregister()
        if self.on_tunnel is not None:
            self.on_tunnel(self, tunnel)
        self._lost_at = None
        try:
            closed = await tunnel.closed
        finally:
            self._lost_at = time.monotonic()
            self.peer_suites = conn.peer_suites  # as the last re-handshake told
            self._let_go()
            self.tunnel = None
            self.accepted_nodes = ()  # the gateway's answer held for that tunnel only
            self.metrics.live.tunnel_down(self.label, tunnel)
            if self.on_tunnel is not None:
                self.on_tunnel(self, None)
        self.last_error = f"{closed.code.label}: {closed.reason}"
        (log.info if self._stopping else log.warning)(
            "tunnel down",
            extra=fields(
                gateway=self.label,
                code=closed.code.label,
                reason=closed.reason,
                doc=doc_link("close", closed.code.label),
            ),
        )

    async def _open(self, tunnel: Tunnel) -> None:
        """Connect the tunnel's byte stream: TCP, or the layers of ``settings.transport``."""
        route = self.settings.transport
        if route is None:
            loop = asyncio.get_running_loop()
            await loop.create_connection(lambda: tunnel, self.address, self.port)
            return
        proxy = route.proxy(self.address, self.port)
        self.via = proxy.label if proxy is not None else ""
        try:
            await connect_tunnel(tunnel, self.address, self.port, route, proxy)
        except TransportFailed as exc:
            self.metrics.transport_failures.labels(exc.stage, exc.label).inc()
            raise

    async def _learn_replica(self, tunnel: Tunnel) -> None:
        """Ask which replica the tunnel reached (before registering: a tunnel to a replica
        already held is closed with the gateway none the wiser) and claim it."""
        self._announced = asyncio.get_running_loop().create_future()
        tunnel.ask_replica()
        try:
            async with asyncio.timeout(self.settings.limits.handshake_timeout_s):
                await asyncio.shield(self._announced)
        except TimeoutError:
            tunnel.close(CloseCode.NORMAL, "no replica announcement")
            raise ConnectionError(
                "the gateway did not say which replica it is (a gateway older than this"
                " agent? upgrade the gateways first)"
            ) from None
        finally:
            self._announced = None
        if tunnel.closed.done():
            raise ConnectionError("tunnel closed before registering")
        if self.pool is not None and not self.pool.claim(self):
            self.duplicates += 1
            log.debug("replica already held", extra=fields(gateway=self.label,
                                                            replica=self.replica_id))  # fmt: skip
            tunnel.close(CloseCode.NORMAL, "this agent already holds that replica")
            await tunnel.aclose()
            raise DuplicateReplica(self.replica_id)
        self.duplicates = 0
        self.holds = True

    def _let_go(self) -> None:
        if self.holds:
            self.holds = False
            if self.pool is not None:
                self.pool.release(self)

    def _on_event(self, tunnel: Tunnel, event: ev.Event) -> None:
        if isinstance(event, ev.ReplicaAnnounced):
            self.replica_id, self.replicas = event.replica_id, event.replicas
            if self._announced is not None and not self._announced.done():
                self._announced.set_result(None)
            elif self.pool is not None:
                self.pool.counted(self)
        elif isinstance(event, ev.GoAwayReceived):
            # the replica is draining: the pool may dial for its successor at once
            self._let_go()
        elif isinstance(event, ev.RegistrationAnswered):
            self.accepted_nodes = event.accepted_nodes
            self.refused = event.refused
            for entry, reason in event.refused:
                log.error(
                    "gateway refused registration",
                    extra=fields(gateway=self.label, node=entry, reason=reason),
                )
            if event.refused:
                self.metrics.registrations_refused.labels(self.label).inc(len(event.refused))
        elif isinstance(event, ev.PongReceived):
            self.metrics.rtt_hist.observe(event.rtt_s)
        elif isinstance(event, ev.StreamReset):
            self.metrics.stream_resets.labels(event.code.label).inc()
        elif isinstance(event, ev.CookieReplied):
            self.metrics.cookie_replies.inc()


def handshake_refusal_hint(exc: BaseException, offered: str) -> str:
    """What an unanswered handshake most likely means. A gateway that accepted the TCP
    connection and closed it right after our initiation refused it: the usual cause is a
    gateway_public_key that is not that gateway's (refused before any DH, ``bad_mac1``),
    then this agent's key not being authorised there (``unknown_key``); with a suite other
    than the default offered, first that the gateway does not accept it."""
    if "peer closed" not in str(exc):
        return (
            "handshake got no answer (gateway_public_key wrong, this agent's key not authorised,"
            " clock went backwards, handshakes rate limited, or a suite it does not accept: this"
            f" agent offered {offered}; the gateway's status page lists refused handshakes)"
        )
    key = (
        "gateway_public_key is not this gateway's key (compare it with `raven pubkey <"
        " gateway.key` on the gateway)"
    )
    if offered != DEFAULT_SUITE.label:  # every gateway accepts the default suite
        likely = f"the gateway does not accept the suite this agent offered {offered} (its" \
            f" transport_suites), else {key}"  # fmt: skip
    else:
        likely = f"{key}, else this agent's key is not in the gateway's agents[]"
    return (
        "the gateway closed the connection after our handshake without answering: most likely"
        f" {likely}; the gateway's status page and `raven status` name the reason"
    )
