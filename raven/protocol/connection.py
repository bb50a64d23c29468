"""TunnelConnection: the one sans-IO object a transport adapter drives.

It drives a :class:`~raven.protocol.secure_channel.SecureChannel` (handshake and
records; the caller builds it: ``TunnelConnection(SecureChannel(role=..., ...))``) with a
:class:`~raven.protocol.mux.Multiplexer` (streams, datagrams, keepalive, drain,
registration) on top. Wire bytes go in with
:meth:`TunnelConnection.receive_data` and come out of
:meth:`TunnelConnection.data_to_send`; events come out of
:meth:`TunnelConnection.next_event`; time is always an argument.

Nothing the peer sends makes ``receive_data`` raise: a handshake rejection, a
bad record or a frame that breaks the protocol closes the tunnel with a CLOSE
frame (when transport keys exist) and a :class:`ConnectionTerminated` event,
after a :class:`StreamReset` (TUNNEL_CLOSED) for every open stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import LENGTH_PREFIX_BYTES
from raven.protocol.datagram_path import DatagramSink
from raven.protocol.errors import HandshakeRejected, LocalProtocolError, RemoteProtocolError
from raven.protocol.events import CookieReplied, Event, HandshakeCompleted
from raven.protocol.lifecycle import ChannelState, TunnelState
from raven.protocol.message_lengths import message_end, missing_bytes
from raven.protocol.mux import Multiplexer
from raven.protocol.registration import encode_register_result
from raven.protocol.secure_channel import Role, SecureChannel
from raven.protocol.stats import TunnelStats
from raven.protocol.suites import Suite

__all__ = ["Role", "TunnelConnection"]

#: ConnectionTerminated reason when the handshake did not finish in time.
HANDSHAKE_TIMEOUT_REASON = "handshake_timeout"
#: ... and when message 1 was answered but no authenticated record followed (a replayed
#: message 1 ends this way: it never replaces a live session).
UNCONFIRMED_REASON = "unconfirmed"


#: Channel states whose input is not u16-length-prefixed messages (the magic comes first).
_NO_WALK = frozenset({ChannelState.AWAIT_MAGIC, ChannelState.FAILED})


class TunnelConnection:
    """One tunnel, either end. See docs/architecture.md for the contract."""

    __slots__ = ("_channel", "_moved_at_pong", "_mux", "_now", "_role", "limits")

    def __init__(self, channel: SecureChannel) -> None:
        """The connection over ``channel`` (a fresh one: its handshake not started), which
        holds the keys, the role, the limits and the clock's first reading."""
        role, limits, now = channel.role, channel.limits, channel.now
        self._role = role
        #: the budgets this connection enforces (raven.protocol.limits)
        self.limits = limits
        self._now = now
        self._channel = channel
        self._mux = Multiplexer(
            initiator=role is Role.INITIATOR,
            limits=limits,
            now=now,
            stats=TunnelStats(wire=channel.stats),
        )
        #: streams opened + datagrams moved, as of the last keepalive round trip
        self._moved_at_pong = 0

    def next_event(self) -> Event | None:
        """The oldest event not yet taken, None when there is none."""
        return self._mux.events.popleft()

    def send_capacity(self, stream_id: int) -> int:
        """Bytes ``stream_id`` may send now (its credit, bounded by the tunnel's)."""
        return self._mux.send_capacity(stream_id)

    def send_stream_data(self, stream_id: int, data: bytes | bytearray | memoryview) -> None:
        """Queue stream data (at most :meth:`send_capacity`; LocalProtocolError on a stream
        that cannot send)."""
        self._mux.send_stream_data(stream_id, data)

    def consume_stream_data(self, stream_id: int, n: int) -> None:
        """The application took ``n`` bytes of the stream: credit flows back when due."""
        self._mux.consume_stream_data(stream_id, n)

    # ------------------------------------------------------------------ properties

    @property
    def role(self) -> Role:
        return self._role

    @property
    def handshake_complete(self) -> bool:
        """Keys confirmed (see raven.protocol.lifecycle): HandshakeCompleted was emitted."""
        return self._channel.handshake_complete

    @property
    def state(self) -> TunnelState:
        return self._mux.state

    @property
    def remote_static(self) -> bytes | None:
        return self._channel.remote_static

    @property
    def suite(self) -> Suite | None:
        """The transport suite of the current keys (None before the handshake)."""
        return self._channel.suites.current

    @property
    def peer_suites(self) -> frozenset[Suite] | None:
        """(initiator) The suites the responder accepts, once its message 2 was read."""
        return self._channel.suites.peer

    @property
    def closed(self) -> bool:
        """ConnectionTerminated was emitted; only a final CLOSE record may still be sent."""
        return self._mux.closed

    @property
    def draining(self) -> bool:
        return self._mux.draining

    @property
    def rtt_s(self) -> float | None:
        return self._mux.rtt_s

    @property
    def open_streams(self) -> int:
        return self._mux.open_streams

    @property
    def buffered_bytes(self) -> int:
        """Bytes received on streams and not yet consumed (see max_tunnel_buffered_bytes)."""
        return self._mux.buffered_bytes

    @property
    def stats(self) -> TunnelStats:
        """Live counters: frames, datagrams, streams, resets; the channel's wire bytes,
        records and rekeys as ``stats.wire``."""
        return self._mux.stats

    def trim(self) -> None:
        """Release the memory an idle tunnel does not need: its AEAD objects (OpenSSL
        contexts, ~2.4 KiB each), record scratch buffers and an empty output buffer. The
        next record makes what it needs again (~1 us per AEAD object)."""
        self._channel.trim()

    def trim_if_quiet(self, *, pong: bool = False) -> None:
        """`trim` when no stream is open and none was opened, nor a datagram moved, since the
        last keepalive round trip. The adapter calls it after each write (a quiet tunnel's
        write carried keepalive traffic only: the PONG to the peer's PING, our next PING) and
        with ``pong`` at each PONG, which then starts the next quiet period (the adapter skips
        the call after a write while it holds streams: the common case costs no call)."""
        mux = self._mux
        stats = mux.stats
        moved = stats.streams_opened + stats.datagrams_sent + stats.datagrams_received
        if not mux.open_streams and moved == self._moved_at_pong:
            self._channel.trim()
        if pong:
            self._moved_at_pong = moved

    # ------------------------------------------------------------------ I/O

    def input_end(self, view: bytes | memoryview, at_least: int) -> int:
        """Where the next piece of input (``view``: what :meth:`receive_data` gets next, in
        order) may end at or past ``at_least`` without cutting a record in two, so that the
        channel holds no partial record a later piece of the same read completes: a reader
        that feeds a large read in pieces (raven.transport.turn_budget) cuts it there."""
        channel = self._channel
        held = channel.held
        if channel.state in _NO_WALK or 0 < len(held) < LENGTH_PREFIX_BYTES:
            return at_least  # no u16-framed messages yet, or a held length not known yet
        return message_end(view, at_least, missing_bytes(channel.state, held) if held else 0)

    def receive_data(self, data: bytes | memoryview, now: float) -> bool:
        """Feed wire bytes from the peer. Never raises for anything the peer sent.

        False when all they brought was one record of one DATAGRAM frame, handed to the
        datagram sink (the datagram lane): no event, nothing to send, no deadline earlier;
        True: look at events, :attr:`has_data_to_send` and :meth:`get_timer`."""
        self._now = now
        if self._mux.closed:
            return True
        cookie_replies = self._channel.stats.cookie_replies
        try:
            payloads = self._channel.receive_data(data, now)
        except HandshakeRejected as rejected:  # one name per exception type (mypyc)
            self._fail(rejected.code, rejected.reason)
            return True
        except RemoteProtocolError as exc:
            self._fail(exc.code, str(exc))
            return True
        mux = self._mux
        if len(payloads) == 1 and mux.receive_lone_datagram(payloads[0], now):
            return False
        if self._channel.stats.cookie_replies != cookie_replies:
            mux.add_event(CookieReplied())
        if mux.state is TunnelState.HANDSHAKING and self._channel.handshake_complete:
            mux.confirm(now)
            remote = self._channel.remote_static
            assert remote is not None
            mux.add_event(HandshakeCompleted(remote))
        self._act(lambda: self._receive_payloads(payloads, now))
        return True

    @property
    def input_waiting(self) -> bool:
        """Frames received wait to be acted on (a bounded number is acted on per call):
        call :meth:`resume_input`, next event-loop turn, until this is False."""
        return bool(self._mux.backlog.pending)  # read directly: once per read

    def resume_input(self, now: float) -> None:
        """Act on more of the frames received earlier (see :attr:`input_waiting`)."""
        self._now = now
        self._act(lambda: self._mux.resume_input(now))

    def _receive_payloads(self, payloads: Iterable[bytes], now: float) -> None:
        """Queue every record of the read, then act on one share of the frames (the bound
        is per read, not per record), unless frames already waited: then the caller's
        resume_input calls, a turn apart, go on with them."""
        waited = bool(self._mux.backlog.pending)
        for payload in payloads:
            self._mux.receive_payload(payload, now, act=False)
        if not waited:
            self._mux.resume_input(now)

    def _act(self, work: Callable[[], None]) -> None:
        try:
            work()
        except RemoteProtocolError as exc:
            self._fail(exc.code, str(exc))
        except LocalProtocolError as bug:  # a bug of ours met on the receive path
            self._fail(CloseCode.INTERNAL, f"internal error: {bug}")

    def set_source_address(self, address: bytes) -> None:
        """(responder) The initiator's packed IP address: cookies are bound to it."""
        self._channel.set_source_address(address)

    def _fail(self, code: CloseCode, reason: str) -> None:
        # a CLOSE record goes out only on a tunnel whose keys were confirmed
        self._mux.close(code, reason)

    def data_to_send(self, max_bytes: int | None = None, now: float | None = None) -> bytes:
        """Wire bytes to write: the handshake, then records sealed from the multiplexer's
        payloads (control first, then fair round-robin stream data) up to about
        ``max_bytes`` of plaintext. ``now`` defaults to the latest time seen."""
        channel = self._channel
        # records go out once the keys are confirmed, and a final CLOSE after a failure
        if channel.handshake_complete or (channel.has_keys and self._mux.closed):
            if now is None:
                now = self._now
            mux = self._mux
            budget = max_bytes
            while budget is None or budget > 0:
                payload = mux.next_payload()
                if payload is None:
                    break
                channel.seal(payload, now)
                if budget is not None:
                    budget -= len(payload)
        return channel.data_to_send()

    @property
    def has_data_to_send(self) -> bool:
        """True when data_to_send would return something (read after every I/O: the channel's
        output and the multiplexer's scheduler are read directly, not through their
        properties)."""
        channel = self._channel
        if channel.output.used:
            return True
        sealing = channel.handshake_complete or (channel.has_keys and self._mux.closed)
        return sealing and self._mux.scheduler.has_output

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must be called next (None: no timer)."""
        if self._mux.closed:
            return None
        channel = self._channel
        if not channel.handshake_complete:
            return channel.handshake_deadline
        timer = self._mux.get_timer()
        rehandshake = channel.rehandshake_at
        if rehandshake is not None and (timer is None or rehandshake < timer):
            return rehandshake
        return timer

    def handle_timer(self, now: float) -> None:
        """Run due timers: handshake timeout, re-handshake, keepalive PING, dead peer,
        drain timeout."""
        self._now = now
        if self._mux.closed:
            return
        if not self._channel.handshake_complete:
            deadline = self._channel.handshake_deadline
            if deadline is not None and now >= deadline:
                reason = HANDSHAKE_TIMEOUT_REASON
                if self._channel.awaiting_confirmation:
                    reason = UNCONFIRMED_REASON
                self._mux.abort(CloseCode.AUTH_FAILED, reason, by_peer=False)
            return
        rehandshake = self._channel.rehandshake_at
        if rehandshake is not None and now >= rehandshake:
            self._channel.start_rehandshake(now)
        self._mux.handle_timer(now)

    # ------------------------------------------------------------------ streams

    def open_stream(self, node: str, port: int, data: bytes = b"", *, bulk: bool = False) -> int:
        return self._mux.open_stream(node, port, data, bulk=bulk)

    def accept_stream(self, stream_id: int) -> None:
        self._mux.accept_stream(stream_id)

    def refuse_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        self._mux.refuse_stream(stream_id, code, reason)

    def end_stream(self, stream_id: int) -> None:
        self._mux.end_stream(stream_id)

    def reset_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        self._mux.reset_stream(stream_id, code, reason)

    # ------------------------------------------------------------------ datagrams, registration

    def send_datagram(self, data: bytes) -> bool:
        return self._mux.send_datagram(data)

    def seal_lone_datagram(self, data: bytes, now: float) -> bytes | None:
        """The datagram lane: when the tunnel is open and nothing waits to be sent, the wire
        bytes of one record carrying ``data`` as its only frame, sealed now and counted as
        sent (write them before anything else); None, nothing done: :meth:`send_datagram`."""
        head = self._mux.lone_datagram_header(len(data))
        if head is None:
            return None
        wire = self._channel.seal_now(head, data, now)
        if wire is not None:
            self._now = now
            self._mux.stats.count_datagrams_sent(1)
        return wire

    def set_datagram_sink(self, sink: DatagramSink | None) -> None:
        """Hand each received L3 packet to ``sink`` (called inside :meth:`receive_data`)
        instead of queuing a DatagramReceived event; None restores the events."""
        self._mux.datagrams.sink = sink

    def register(self, nodes: Iterable[str], prefixes: Iterable[str]) -> None:
        self._mux.register(nodes, prefixes)

    def answer_registration(
        self,
        accepted_nodes: Iterable[str],
        accepted_prefixes: Iterable[str],
        refused: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.send_registration_answer(
            self.registration_answer(accepted_nodes, accepted_prefixes, refused)
        )

    def registration_answer(
        self,
        accepted_nodes: Iterable[str],
        accepted_prefixes: Iterable[str],
        refused: Iterable[tuple[str, str]] = (),
    ) -> Iterator[bytes]:
        """The answer's frames, each encoded when taken: a gateway answering 16,384 names
        takes one (~1,000 names) per event-loop turn, then :meth:`send_registration_answer`."""
        return encode_register_result(
            accepted_nodes, accepted_prefixes, refused, self._mux.chunk_bytes
        )

    def send_registration_answer(self, frames: Iterable[bytes]) -> None:
        self._mux.answer_registration(frames)

    def ask_replica(self) -> None:
        """(agent) Ask which gateway replica this tunnel reached: ReplicaAnnounced answers."""
        self._mux.replica.ask()

    @property
    def replica_asked(self) -> bool:
        """(gateway) The agent asked which replica it reached (it understands REPLICA)."""
        return self._mux.replica.asked

    def announce_replica(self, replica_id: str, replicas: int) -> None:
        """(gateway) Answer ReplicaAsked; again whenever the replica count changes."""
        self._mux.replica.announce(replica_id, replicas)

    # ------------------------------------------------------------------ lifecycle

    def go_away(self, code: CloseCode, reason: str = "", now: float | None = None) -> None:
        """Drain: GOAWAY to the peer, no new streams either way; open streams get
        ``drain_timeout_s`` (from ``now``, default the latest time seen) to finish."""
        self._mux.go_away(code, reason, self._now if now is None else now)

    def close(self, code: CloseCode = CloseCode.NORMAL, reason: str = "") -> None:
        """Close the tunnel: every stream is reset, a CLOSE record is the last one sent
        (when keys exist), ConnectionTerminated(by_peer=False) is emitted."""
        self._fail(code, reason)
