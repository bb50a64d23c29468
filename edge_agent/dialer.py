"""The agent's dialer: one tunnel to every gateway replica, found through DNS.

The gateway name is resolved with dnspython (A and AAAA). Every address gets its own
link that dials out, handshakes, registers and serves until the tunnel dies, then
reconnects with exponential backoff and full jitter. The name is re-resolved
periodically: new replicas get a link, vanished ones are dropped.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raven.backoff import backoff_delay
from raven.hostport import parse_hostport
from raven.logs import fields
from raven.metrics import TunnelMetrics
from raven.protocol import events as ev
from raven.protocol.connection import TunnelConnection
from raven.protocol.cookie import CookieJar
from raven.protocol.limits import Limits
from raven.protocol.secure_channel import Role
from raven.protocol.suites import DEFAULT_SUITES, Suite, first_suite
from raven.transport.tunnel import StreamHandler, Tunnel

if TYPE_CHECKING:
    import dns.asyncresolver

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


async def resolve_gateway(host: str, resolver: dns.asyncresolver.Resolver | None) -> list[str]:
    """All addresses of ``host`` (an IP literal is itself), sorted; [] when nothing resolves."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    import dns.asyncresolver  # only for names: a gateway given as an address needs no DNS
    import dns.exception

    res = resolver or dns.asyncresolver.Resolver()
    found: set[str] = set()
    for rdtype in ("A", "AAAA"):
        try:
            answer = await res.resolve(host, rdtype, lifetime=5.0)
        except (dns.exception.DNSException, OSError) as exc:
            log.debug("resolve failed host=%s type=%s err=%s", host, rdtype, exc)
            continue
        found.update(r.to_text() for r in answer)
    return sorted(found)


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
        #: monotonic time the last tunnel was lost, while the path is believed broken
        self._lost_at: float | None = None
        #: the suites this gateway accepted last time (None: not connected yet)
        self.peer_suites: frozenset[Suite] | None = None

    @property
    def label(self) -> str:
        return (
            f"[{self.address}]:{self.port}"
            if ":" in self.address
            else f"{self.address}:{self.port}"
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"link {self.label}")

    async def stop(self, *, graceful: bool = True) -> None:
        self._stopping = True
        if self.tunnel is not None and graceful:
            self.tunnel.go_away("agent shutting down")
            await self.tunnel.wait_streams_done(self.settings.limits.drain_timeout_s)
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

    def _new_connection(self, now: float) -> TunnelConnection:
        """The sans-IO tunnel of one attempt: its suite follows what this gateway accepted
        last time (``peer_suites``), its message 1 the cookie it sent (``cookie_jar``)."""
        settings = self.settings
        return TunnelConnection(
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
                await loop.create_connection(lambda: tunnel, self.address, self.port)
            try:
                await tunnel.handshake
            except ConnectionError as exc:
                self.metrics.handshakes.labels("failed").inc()
                # the gateway may have stopped accepting the suite it accepted last time: the
                # next attempt starts from the default
                self.peer_suites = None
                # the gateway answers nothing useful on purpose; say what it can mean
                raise ConnectionError(
                    f"{exc}: handshake got no answer (gateway_public_key wrong, this agent's key"
                    " not authorised, clock went backwards, handshakes rate limited, or a suite it"
                    f" does not accept: this agent offered {offered.label}; see the"
                    " gateway's raven_handshakes_total)"
                ) from None
        self.metrics.handshakes.labels("ok").inc()
        self.peer_suites = conn.peer_suites
        self.tunnel = tunnel
        self.connects += 1
        self.metrics.live.tunnel_up(self.label, tunnel)
        log.info("tunnel up", extra=fields(gateway=self.label))
        self.reregister()
        if self.on_tunnel is not None:
            self.on_tunnel(self, tunnel)
        self._lost_at = None
        try:
            closed = await tunnel.closed
        finally:
            self._lost_at = time.monotonic()
            self.peer_suites = conn.peer_suites  # as the last re-handshake told
            self.tunnel = None
            self.metrics.live.tunnel_down(self.label, tunnel)
            if self.on_tunnel is not None:
                self.on_tunnel(self, None)
        self.last_error = f"{closed.code.label}: {closed.reason}"
        (log.info if self._stopping else log.warning)(
            "tunnel down",
            extra=fields(gateway=self.label, code=closed.code.label, reason=closed.reason),
        )

    def _on_event(self, tunnel: Tunnel, event: ev.Event) -> None:
        if isinstance(event, ev.RegistrationAnswered):
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


class Dialer:
    """Maintains a GatewayLink for every address the gateway name resolves to."""

    def __init__(
        self,
        gateway: str,
        settings: DialSettings,
        *,
        link_factory: Callable[[str, int], GatewayLink],
        resolve_interval_s: float,
        dns_server: str | None = None,
    ) -> None:
        self.host, self.port = parse_hostport(gateway)
        self.settings = settings
        self.link_factory = link_factory
        self.resolve_interval_s = resolve_interval_s
        self.links: dict[str, GatewayLink] = {}
        self.resolver: dns.asyncresolver.Resolver | None = None
        if dns_server:
            import dns.asyncresolver

            dhost, dport = parse_hostport(dns_server, default_port=53)
            self.resolver = dns.asyncresolver.Resolver(configure=False)
            self.resolver.nameservers = [dhost]
            self.resolver.port = dport
        self._task: asyncio.Task[None] | None = None
        self.resolved_once = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="dialer")

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.resolve_interval_s)

    async def refresh(self) -> None:
        addresses = await resolve_gateway(self.host, self.resolver)
        if not addresses:
            log.warning(
                "gateway name resolves to nothing host=%s (keeping existing links)", self.host
            )
            return
        for addr in addresses:
            if addr not in self.links:
                link = self.link_factory(addr, self.port)
                self.links[addr] = link
                link.start()
                log.info("gateway replica added addr=%s", link.label)
        for addr in list(self.links):
            if addr not in addresses:
                link = self.links.pop(addr)
                log.info("gateway replica gone addr=%s", link.label)
                await link.stop(graceful=True)
        self.resolved_once.set()

    def reregister(self) -> None:
        for link in self.links.values():
            link.reregister()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        links = list(self.links.values())
        self.links.clear()
        await asyncio.gather(*(link.stop(graceful=True) for link in links), return_exceptions=True)
