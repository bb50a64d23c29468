"""The asyncio adapter: drives one sans-IO TunnelConnection over a TCP transport.

Everything about the protocol lives in :mod:`raven.protocol`; this module moves bytes
between the socket and the connection, hands its stream events to its streams
(:mod:`raven.transport.tunnel_streams`), settles its own futures and keeps the connection's
timer armed: with that module, the only place where the tunnel meets asyncio.

What the peer did to a stream reaches the application as :class:`StreamResetError` /
:class:`StreamOpenError`; an illegal call of ours raises :class:`LocalProtocolError`,
never swallowed. Events are processed iteratively (a handler calling back into the
tunnel queues events for the same loop, never a nested one), and a read's frames and
events a turn's budget at a time (:mod:`raven.transport.turn_budget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import typing
from collections.abc import Callable

from raven.protocol import events as ev
from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.connection import TunnelConnection
from raven.protocol.errors import LocalProtocolError
from raven.transport.deadlines import Deadlines
from raven.transport.read_buffer import CopyingReader
from raven.transport.send_burst import SEND_BURST
from raven.transport.stream import OpenFailure, StreamOpenError
from raven.transport.tunnel_stream import TunnelStream
from raven.transport.tunnel_streams import StreamHandler, TunnelStreams
from raven.transport.turn_budget import SLICE_BYTES, TURN_BUDGET_S, TurnBudget

__all__ = ["DatagramHandler", "EventHandler", "StreamHandler", "Tunnel", "TunnelStream"]

log = logging.getLogger(__name__)

DatagramHandler = Callable[[bytes], None]
#: told which tunnel (one handler serves a listener's every tunnel, no closure per tunnel)
EventHandler = Callable[["Tunnel", ev.Event], None]

#: The protocol's clock: CLOCK_MONOTONIC like the event loop's timers, at full resolution
#: (uvloop's loop.time() is cached in whole milliseconds, too coarse for loopback RTTs).
_now = time.monotonic

#: Transport write buffer above which we stop pulling stream data into records: bytes past the
#: kernel's (NOTSENT_LOWAT_BYTES) wait here in order, so this is kept small (on a 2 Mbit/s link
#: 1 MiB was 4 s in front of every scrape); a fast link drains it at once.
WRITE_HIGH_WATER_BYTES = 64 * 1024
WRITE_LOW_WATER_BYTES = 16 * 1024
#: Most bytes pulled from the connection per transport.write(): this less what the transport
#: buffers already, at least a record's worth.
WRITE_CHUNK_BYTES = 64 * 1024
_MIN_PULL_BYTES = 16 * 1024
#: Unsent bytes the kernel keeps per tunnel socket (TCP_NOTSENT_LOWAT): beyond it the socket
#: is not writable and records wait in the scheduler, which orders them (fair round robin,
#: control first), instead of in a send buffer that autotuning grows to megabytes: on a
#: 2 Mbit/s edge link that was seconds of queue in front of every small scrape.
NOTSENT_LOWAT_BYTES = 16 * 1024
_TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # Linux's value
#: A stream write this large goes out at once when no flush is due (no call_soon round).
IMMEDIATE_WRITE_BYTES = 16 * 1024


class Tunnel(CopyingReader):
    """One tunnel connection; works for both the agent (initiator) and the gateway."""

    # fmt: off
    __slots__ = (
        "_budget", "_deadlines", "_flush_scheduled", "_handshake", "_in_events", "_in_flush",
        "_on_datagram", "_receiving", "_resume_due", "_write_paused",
        "_write_resumed", "admit", "closed", "conn", "deadline_at", "loop", "name", "on_event",
        "peer", "rtt_s", "streams", "transport",
    )
    # fmt: on

    def __init__(
        self,
        conn: TunnelConnection,
        *,
        on_stream: StreamHandler | None = None,
        on_datagram: DatagramHandler | None = None,
        on_event: EventHandler | None = None,
        name: str = "tunnel",
        admit: Callable[[Tunnel], bool] | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.conn = conn
        self.admit = admit
        self.name = name
        self._on_datagram: DatagramHandler | None = None
        self.on_datagram = on_datagram
        self.on_event = on_event
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: str = "?"
        #: made when first asked for (an agent waits on it; a gateway's tunnels never do)
        self._handshake: asyncio.Future[bytes] | None = None
        self.closed: asyncio.Future[ev.ConnectionTerminated] = self.loop.create_future()
        self.streams = TunnelStreams(self, on_stream, max_streams=conn.limits.max_streams)
        self.rtt_s: float | None = None
        #: the timer this tunnel's deadline is kept on (a listener shares one: no loop
        #: timer per tunnel); ``deadline_at``: the pending deadline
        self._deadlines = deadlines if deadlines is not None else Deadlines(self.loop)
        self.deadline_at: float | None = None
        self._write_paused = False
        #: set when writing resumes; made by the first writer that waits (most never do)
        self._write_resumed: asyncio.Event | None = None
        self._in_flush = self._in_events = self._receiving = False
        #: made on a tunnel's first large read or long turn (most never have one)
        self._budget: TurnBudget | None = None
        self._flush_scheduled = False
        #: a _resume_input is deferred to the next turn (received frames wait)
        self._resume_due = False

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here
        self.transport = typing.cast(asyncio.Transport, transport)
        transport = self.transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}" if ":" not in peer[0] else f"[{peer[0]}]:{peer[1]}"
        if self.admit is not None and not self.admit(self):
            transport.abort()
            self._terminate(CloseCode.LIMIT_EXCEEDED, "not admitted", by_peer=False)
            return
        self._after_io()

    def data_received(self, data: bytes) -> None:
        if len(data) > SLICE_BYTES:  # a large read in slices, a turn's CPU budget at a time
            self._turn_budget().feed(data)
        elif self._receive(data):  # else only an L3 packet, already handed on: nothing to do
            self._after_io()

    def _turn_budget(self) -> TurnBudget:
        if self._budget is None:
            self._budget = TurnBudget(self.loop, self._receive, self._after_io,
                                      lambda: self.transport,
                                      boundary=self.conn.input_end)  # fmt: skip
        return self._budget

    def _receive(self, data: bytes | memoryview | None) -> bool:
        """Feed a read (None: act on more of the frames earlier reads brought); False when
        it only brought a packet for on_datagram (TunnelConnection.receive_data)."""
        conn = self.conn
        self._receiving = True  # datagram handlers run inside receive_data
        try:
            if data is None:
                conn.resume_input(_now())
                acts = True
            else:
                acts = conn.receive_data(data, _now())
        finally:
            self._receiving = False
        # frames wait: more next turn, reading paused (once: frames wait only while it is due)
        if acts and not self._resume_due and conn.input_waiting:
            self._resume_due = True
            self._turn_budget().defer(self._resume_input)
        return acts

    def _resume_input(self) -> None:
        self._resume_due = False
        self._receive(None)
        self._after_io()

    def eof_received(self) -> bool | None:
        self._terminate(CloseCode.CONNECTION_LOST, "peer closed the connection", by_peer=True)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        reason = f"connection lost: {exc}" if exc else "connection closed"
        self._terminate(CloseCode.CONNECTION_LOST, reason, by_peer=True)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers()
        self._flush_now()
        self.streams.all_writable()

    def _wake_writers(self) -> None:
        resumed, self._write_resumed = self._write_resumed, None
        if resumed is not None:
            resumed.set()

    # ------------------------------------------------------------ public API
    @property
    def handshake(self) -> asyncio.Future[bytes]:
        """Resolves with the peer's static key once the handshake completed; fails with
        ConnectionError when the tunnel closes first."""
        if self._handshake is None:
            done = self._handshake = self.loop.create_future()
            if self.conn.handshake_complete and (key := self.conn.remote_static) is not None:
                done.set_result(key)
            elif self.closed.done():
                self._fail_handshake(self.closed.result().reason)
        return self._handshake

    def _fail_handshake(self, reason: str) -> None:
        """The tunnel closed before its handshake completed: the waiter's ConnectionError."""
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ConnectionError(f"tunnel closed: {reason}"))
            self._handshake.exception()  # retrieved: its waiter may be gone

    @property
    def write_paused(self) -> bool:
        """The transport is over its high-water mark (stream writers wait)."""
        return self._write_paused and not self.closed.done()

    @property
    def draining(self) -> bool:
        """GOAWAY sent or received (the connection's lifecycle state)."""
        return self.conn.draining

    async def open_stream(
        self, node: str, port: int, *, timeout_s: float, data: bytes = b"", bulk: bool = False
    ) -> TunnelStream:
        """Open a stream to ``node``:``port`` through this tunnel; ``data`` (at most
        MAX_OPEN_DATA_BYTES) rides with the OPEN, before the answer; ``bulk``: low priority
        (a backfill: other streams' data goes first, raven.protocol.scheduler)."""
        if self.closed.done():
            raise StreamOpenError(OpenFailure.TUNNEL_CLOSED, "tunnel closed")
        if self.draining:
            raise StreamOpenError(OpenFailure.DRAINING, "tunnel draining")
        try:
            stream_id = self.conn.open_stream(node, port, data, bulk=bulk)
        except LocalProtocolError as exc:
            raise StreamOpenError(OpenFailure.BUSY, str(exc)) from None
        stream = TunnelStream(self, stream_id, incoming=False)
        stream.opened = self.loop.create_future()
        self.streams.add(stream)
        self._after_io()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(stream.opened)
        except TimeoutError:
            stream.reset(StreamCode.CANCELLED, "open timed out")
            raise StreamOpenError(OpenFailure.TARGET_TIMEOUT, "open timed out") from None
        except asyncio.CancelledError:
            stream.reset(StreamCode.CANCELLED, "opener cancelled")
            raise
        return stream

    @property
    def on_datagram(self) -> DatagramHandler | None:
        """Receives each L3 packet, called straight from the receive path (no event);
        while None, packets reach ``on_event`` as DatagramReceived events."""
        return self._on_datagram

    @on_datagram.setter
    def on_datagram(self, handler: DatagramHandler | None) -> None:
        self._on_datagram = handler
        self.conn.set_datagram_sink(handler)

    def send_datagram(self, data: bytes) -> bool:
        """Send one L3 packet; False when dropped. Never blocks. When nothing else is pending
        it is sealed and written at once, alone (the connection's datagram lane); inside a
        TUN read batch it waits for the batch's end (see send_burst); else it goes with the
        flush that is due."""
        if self.closed.done():
            return False
        transport = self.transport
        busy = self._flush_due()
        if not (busy or transport is None or self._write_paused or SEND_BURST.depth):
            wire = self.conn.seal_lone_datagram(data, _now())
            if wire is not None:
                transport.write(wire)
                return True
        if not self.conn.send_datagram(data):
            return False
        if busy:
            self._flush()  # it goes with the flush that is due
        elif SEND_BURST.defer(self._flush_now):
            self._flush_scheduled = True  # once per batch, at its end
        else:
            self._flush_now()
        return True

    def send_capacity(self, stream_id: int) -> int:
        return 0 if self.closed.done() else self.conn.send_capacity(stream_id)

    def register(self, nodes: list[str], prefixes: list[str]) -> None:
        self.call(lambda c: c.register(nodes, prefixes))

    def answer_registration(self, frames: list[bytes]) -> None:
        """Send a registration's answer (frames of ``conn.registration_answer``)."""
        self.call(lambda c: c.send_registration_answer(frames))

    def ask_replica(self) -> None:
        """(agent) Ask which gateway replica this is: ReplicaAnnounced reaches on_event."""
        self.call(lambda c: c.ask_replica())

    def announce_replica(self, replica_id: str, replicas: int) -> None:
        """(gateway) Tell an agent that asked which replica this is and how many there are."""
        self.call(lambda c: c.announce_replica(replica_id, replicas))

    def go_away(self, reason: str = "shutting down") -> None:
        """Start draining: no new streams either way; open ones go on. A tunnel still
        in its handshake has nothing to drain: it is closed."""
        if self.closed.done():
            return
        if not self.conn.handshake_complete:
            self.close(CloseCode.DRAINED, reason)
            return
        self.call(lambda c: c.go_away(CloseCode.DRAINED, reason))

    def close(self, code: CloseCode = CloseCode.NORMAL, reason: str = "closing") -> None:
        """Close now: CLOSE frame, then the TCP connection."""
        if not self.closed.done():
            self.call(lambda c: c.close(code, reason))
        self._terminate(code, reason, by_peer=False)

    # ------------------------------------------------------------ what streams call
    def call(self, fn: Callable[[TunnelConnection], object]) -> None:
        """Run one call on the connection (a no-op once the tunnel is closed: every
        stream was already aborted). An illegal call raises LocalProtocolError."""
        if self.closed.done():
            return
        fn(self.conn)
        self._after_io()

    def send_stream_data(self, stream_id: int, data: bytes | memoryview) -> None:
        """Queue stream data (within its credit) and see it written this turn or now."""
        self.conn.send_stream_data(stream_id, data)
        if len(data) >= IMMEDIATE_WRITE_BYTES and not self._flush_due():
            self._flush_now()
        else:
            self._flush()

    def consume_stream_data(self, stream_id: int, n: int) -> None:
        """The application took ``n`` bytes of a stream: their credit may flow back."""
        if self.closed.done():
            return
        self.conn.consume_stream_data(stream_id, n)
        if self.conn.has_data_to_send:  # credit is sent back once a quarter window was read
            self._flush()

    async def wait_writable(self) -> None:
        """Return once the transport is under its mark again (at once when it is)."""
        if self._write_paused and not self.closed.done():
            if self._write_resumed is None:
                self._write_resumed = asyncio.Event()
            await self._write_resumed.wait()

    # ------------------------------------------------------------ the engine
    def _after_io(self) -> None:
        self._process_events()
        if self.conn.has_data_to_send:  # a record that only brought data wants no write
            self._flush()
        self._arm_timer()

    def _flush_due(self) -> bool:
        """A flush is scheduled, running or follows the receive or events: sends join it."""
        return self._flush_scheduled or self._receiving or self._in_flush or self._in_events

    def _flush(self) -> None:
        """Schedule one write of everything pending for this loop turn: calls made in the
        same turn (stream writes, credits, accepts) share records and one syscall."""
        if self._flush_scheduled or self.transport is None:
            return
        self._flush_scheduled = True
        self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        if self._in_flush or self.transport is None or self.closed.done():
            return
        self._in_flush = True
        try:
            while not self._write_paused and (transport := self.transport) is not None:
                pull = WRITE_CHUNK_BYTES - transport.get_write_buffer_size()
                data = self.conn.data_to_send(max(pull, _MIN_PULL_BYTES), _now())
                if not data:
                    break
                transport.write(data)
                if not self.conn.has_data_to_send:
                    break  # the common case: one round, no empty second pull
        finally:
            self._in_flush = False
        if not self.streams:  # none open: this write may be a quiet tunnel's keepalive
            self.conn.trim_if_quiet()
        self._process_events()
        self._arm_timer()

    def _arm_timer(self) -> None:
        when = self.conn.get_timer()
        if when != self.deadline_at and not self.closed.done():
            self._deadlines.set(self, when)

    def deadline_due(self) -> None:
        """The connection's deadline came (a keepalive, a timeout): run its timers."""
        self.conn.handle_timer(_now())
        self._after_io()

    def _process_events(self) -> None:
        """Dispatch queued events in a loop. A handler that calls back into the tunnel
        lands here again: that inner call returns at once and the outer loop picks up
        the events it queued (iterative, never re-entrant)."""
        if self._in_events:
            return
        self._in_events = True
        started = time.perf_counter()
        try:
            while (event := self.conn.next_event()) is not None:
                self._dispatch(event)
                if time.perf_counter() - started > TURN_BUDGET_S:  # the rest next turn
                    self._turn_budget().defer(self._after_io)
                    break
        finally:
            self._in_events = False

    def _dispatch(self, event: ev.Event) -> None:
        """One event: a stream's to its stream (data and windows are the streams' own
        business, the most frequent events by far: no on_event), the tunnel's settled here;
        every other event passed on to ``on_event`` afterwards."""
        streams = self.streams
        if isinstance(event, ev.StreamDataReceived):
            streams.data(event.stream_id, event.data)
            return
        if isinstance(event, ev.StreamWindowOpened):
            streams.window_opened(event.stream_id)
            return
        if streams.dispatch(event):
            pass
        elif isinstance(event, ev.DatagramReceived):
            if self.on_datagram is not None:
                self.on_datagram(event.data)
        elif isinstance(event, ev.HandshakeCompleted):
            if self._handshake is not None and not self._handshake.done():
                self._handshake.set_result(event.remote_static)
        elif isinstance(event, ev.PongReceived):
            self.rtt_s = event.rtt_s
            self.conn.trim_if_quiet(pong=True)
        elif isinstance(event, ev.ConnectionTerminated):
            self._terminate(event.code, event.reason, by_peer=event.by_peer, event=event)
            return
        if self.on_event is not None:
            self.on_event(self, event)

    def _terminate(
        self,
        code: CloseCode,
        reason: str,
        *,
        by_peer: bool,
        event: ev.ConnectionTerminated | None = None,
    ) -> None:
        if self.closed.done():
            return
        self._deadlines.set(self, None)
        self.streams.abort_all(reason)
        self._fail_handshake(reason)
        final = event or ev.ConnectionTerminated(code=code, reason=reason, by_peer=by_peer)
        self.closed.set_result(final)
        self._wake_writers()
        if self.transport is not None:
            # push out a final CLOSE frame if the connection produced one
            try:
                data = self.conn.data_to_send()
            except Exception:
                data = b""
            if data:
                self.transport.write(data)
            self.transport.close()
        if self.on_event is not None:
            self.on_event(self, final)

    async def aclose(self) -> None:
        """Close and wait for handler tasks to finish (nothing left running)."""
        self.close()
        await self.streams.cancel_handlers()
