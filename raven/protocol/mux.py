"""Multiplexer: frames <-> streams, the fair scheduler, keepalive, drain, registration.

Sans-IO over plaintext record payloads: :meth:`Multiplexer.receive_payload` takes the frames
payload of one record, :meth:`Multiplexer.next_payload` produces the next one to seal (at most
``MAX_RECORD_PAYLOAD_BYTES`` bytes). Events come out of ``Multiplexer.events`` (``popleft``:
None when empty). The peer's violations raise :class:`RemoteProtocolError` (the caller then calls
:meth:`Multiplexer.abort`); our own illegal calls raise :class:`LocalProtocolError`.

Sending order inside a payload: control frames (OPEN, CREDIT, RESET, PONG...) first, then
datagrams (at most half the payload while streams wait), then stream data by deficit round
robin (quantum ``limits.max_frame_payload_bytes``): one busy stream cannot starve the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from raven.protocol.budget import ControlBudget
from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import MAX_FRAME_PAYLOAD_BYTES
from raven.protocol.datagram_path import (
    DatagramInbox,
    datagram_header,
    lone_datagram,
    split_datagrams,
)
from raven.protocol.errors import LocalProtocolError
from raven.protocol.event_queue import EventQueue
from raven.protocol.events import (
    ConnectionTerminated,
    Event,
    GoAwayReceived,
    PongReceived,
    StreamDataReceived,
    StreamOpened,
    StreamRefused,
    StreamReset,
)
from raven.protocol.frame_backlog import FrameBacklog
from raven.protocol.frame_fields import clean_reason
from raven.protocol.frames import (
    CloseFrame,
    CreditFrame,
    DataFrame,
    DatagramFrame,
    EndFrame,
    Frame,
    GoAwayFrame,
    OpenFrame,
    OpenResultFrame,
    PingFrame,
    PongFrame,
    RegisterFrame,
    RegisterResultFrame,
    ReplicaFrame,
    ResetFrame,
    encode_frame,
    lone_data,
    parse_frames,
)
from raven.protocol.keepalive import Keepalive
from raven.protocol.lifecycle import DRAINING_STATES, TunnelInput, TunnelState, next_tunnel_state
from raven.protocol.limits import Limits
from raven.protocol.registration import RegistrationAssembler, encode_register
from raven.protocol.replica_exchange import ReplicaExchange
from raven.protocol.scheduler import Scheduler
from raven.protocol.stats import TunnelStats
from raven.protocol.stream_control import apply_stream_control, finish_stream
from raven.protocol.stream_table import StreamTable
from raven.protocol.streams import (
    RECEIVING_STATES,
    SENDING_STATES,
    Stream,
    StreamInput,
    StreamState,
)

__all__ = ["Multiplexer"]

#: Queued control bytes (PONGs, refusals, answers) a peer may leave unread before LIMIT_EXCEEDED.
MAX_PEER_INDUCED_CONTROL_BYTES = 1024 * 1024

_I = StreamInput


class Multiplexer:
    """Streams, datagrams, keepalive and registration over record payloads.

    ``initiator`` decides the stream id parity (initiator odd, responder even)
    and who may register (the initiator registers, the responder answers). ``stats``: the
    counters to keep (a TunnelConnection passes one holding its channel's); a fresh one if
    not given.
    """

    # fmt: off
    __slots__ = (
        "_budget", "_drain_deadline", "_initiator", "_keepalive", "_limits", "_max_datagram",
        "_registration", "_state", "_table", "backlog", "chunk_bytes", "closed", "datagrams",
        "draining", "events", "replica", "scheduler", "stats",
    )
    # fmt: on

    def __init__(
        self, *, initiator: bool, limits: Limits, now: float, stats: TunnelStats | None = None
    ) -> None:
        self._limits = limits
        self._initiator = initiator
        self._table = StreamTable(initiator=initiator, limits=limits)
        #: this tunnel's counters (read them for metrics)
        self.stats = stats if stats is not None else TunnelStats()
        #: what goes out next (read by the connection; only this multiplexer queues into it)
        self.scheduler = Scheduler(limits.max_frame_payload_bytes, self.stats, self._on_end_sent)
        #: registration frames' payload size
        self.chunk_bytes = max(1024, min(limits.max_frame_payload_bytes, MAX_FRAME_PAYLOAD_BYTES))
        self._max_datagram = min(limits.max_datagram_bytes, MAX_FRAME_PAYLOAD_BYTES)
        #: the events this tunnel produced, oldest first (``popleft``: None when empty)
        self.events = EventQueue()
        #: received L3 packets: to ``datagrams.sink`` when set, else DatagramReceived events
        self.datagrams = DatagramInbox(self.events, self.stats, limits.max_datagram_bytes)
        #: the tunnel's lifecycle (raven.protocol.lifecycle.TUNNEL_TRANSITIONS)
        self._state = TunnelState.HANDSHAKING
        #: the tunnel is CLOSED; draining: GOAWAY was sent or received, no new streams
        #: either way (both kept beside the state: read on every receive, send and request)
        self.closed = self.draining = False
        self._drain_deadline: float | None = None
        self._keepalive = Keepalive(limits, now)
        self._registration = RegistrationAssembler(
            initiator=initiator, max_entries=limits.max_registration_entries
        )
        self._budget = ControlBudget(limits, now)
        #: REPLICA frames: ``replica.ask()`` (agent), ``replica.announce(...)`` (gateway)
        self.replica = ReplicaExchange(initiator, self._queue_control, self._queue_peer_induced)
        #: received frames waiting to be acted on (read by the connection; only this fills it)
        self.backlog = FrameBacklog(self._on_data, self._on_control, self.stats.frames_received)

    # ------------------------------------------------------------------ properties

    @property
    def state(self) -> TunnelState:
        return self._state

    def _move(self, event: TunnelInput) -> TunnelState:
        state = self._state = next_tunnel_state(self._state, event)
        self.closed = state is TunnelState.CLOSED
        self.draining = state in DRAINING_STATES
        return state

    @property
    def rtt_s(self) -> float | None:
        """Latest PING/PONG round-trip time, None before the first PONG."""
        return self._keepalive.rtt_s

    @property
    def open_streams(self) -> int:
        return len(self._table)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received on streams and not yet consumed by the application."""
        return self._table.buffered

    def stream_state(self, stream_id: int) -> StreamState | None:
        stream = self._table.streams.get(stream_id)
        return None if stream is None else stream.state

    def add_event(self, event: Event) -> None:
        """Queue an event produced by the layer above (e.g. HandshakeCompleted)."""
        self.events.append(event)

    # ------------------------------------------------------------------ streams: our calls

    def open_stream(self, node: str, port: int, data: bytes = b"", *, bulk: bool = False) -> int:
        """Ask for a stream to ``node``:``port`` (``data``: its first bytes, paid from the peer's
        grant; ``bulk``: low priority, raven.protocol.scheduler); StreamAccepted or
        StreamRefused follows (BUSY at once at max_streams)."""
        self._move(TunnelInput.SEND_OPEN_STREAM)
        table = self._table
        stream_id = table.next_local_id()
        open_frame = encode_frame(OpenFrame(stream_id, node, port, data))  # validates all
        table.take_local_id()
        window, busy = table.window_for_new_stream()
        if busy:
            self.events.append(StreamRefused(stream_id, StreamCode.BUSY, busy))
            return stream_id
        stream = table.add(stream_id, window)
        stream.bulk = bulk
        stream.apply(_I.SEND_OPEN)
        stream.send_credit = -len(data)  # the peer's grant covers the OPEN's data too
        self._queue_control(open_frame)
        self._grant_window(stream)
        self.stats.streams_opened += 1
        return stream_id

    def accept_stream(self, stream_id: int) -> None:
        stream = self._table.local(stream_id)
        stream.apply(_I.SEND_ACCEPT)
        self._queue_control(encode_frame(OpenResultFrame(stream_id, StreamCode.OK)))
        self._grant_window(stream)
        self.stats.streams_opened += 1

    def refuse_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        if code is StreamCode.OK:
            raise LocalProtocolError("refuse_stream needs a code other than OK")
        stream = self._table.local(stream_id)
        stream.apply(_I.SEND_REFUSE)
        self._table.forget(stream)
        self._queue_peer_induced([encode_frame(OpenResultFrame(stream_id, code, reason))])

    def send_capacity(self, stream_id: int) -> int:
        """Bytes ``send_stream_data`` accepts now (0 for an unknown or finished stream)."""
        stream = self._table.streams.get(stream_id)
        if stream is None or stream.state not in SENDING_STATES:
            return 0
        return max(0, stream.send_credit)

    def send_stream_data(self, stream_id: int, data: bytes | bytearray | memoryview) -> None:
        stream = self._table.local(stream_id)
        stream.apply(_I.SEND_DATA)
        if not data:
            return
        stream.enqueue(data)
        self.scheduler.schedule(stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close: END goes out after the data already queued."""
        stream = self._table.local(stream_id)
        stream.apply(_I.SEND_END)
        stream.end_pending = True
        self.scheduler.schedule(stream)

    def reset_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        """Abort a stream; a no-op for a stream that is already gone (races with the peer)."""
        stream = self._table.streams.get(stream_id)
        if stream is None or self.closed:
            return
        self._send_reset(stream, code, reason)

    def consume_stream_data(self, stream_id: int, size: int) -> None:
        """The application read ``size`` bytes of the stream: credit may flow back."""
        stream = self._table.streams.get(stream_id)
        if stream is None:
            return  # reset or closed meanwhile; its bytes were already released
        grant = stream.state in RECEIVING_STATES and not self.closed
        increment = stream.on_consumed(size, self._limits.credit_update_ratio, grant=grant)
        self._table.buffered -= size
        if increment:
            increment = self._table.retarget(stream, increment)
        if increment:
            stream.apply(_I.SEND_CREDIT)
            self._queue_control(encode_frame(CreditFrame(stream_id, increment)))

    def _grant_window(self, stream: Stream) -> None:
        stream.apply(_I.SEND_CREDIT)
        self._queue_control(encode_frame(CreditFrame(stream.stream_id, stream.grant_window())))

    def _send_reset(self, stream: Stream, code: StreamCode, reason: str) -> None:
        stream.apply(_I.SEND_RESET)
        stream.discard_queue()
        self._queue_control(encode_frame(ResetFrame(stream.stream_id, code, reason)))
        self.stats.count_reset(code.label)
        self._table.forget(stream)

    # ------------------------------------------------------------------ datagrams, registration

    def send_datagram(self, data: bytes) -> bool:
        """Queue one L3 packet; False (dropped, counted) when oversize, queue full or closed."""
        if self.closed:
            return self.stats.count_drop("closed")
        if not data or len(data) > self._max_datagram:
            return self.stats.count_drop("oversize")
        limits = self._limits
        count, size = limits.max_queued_datagrams, limits.max_queued_datagram_bytes
        if not self.scheduler.queue_datagram(bytes(data), count, size):
            return self.stats.count_drop("queue_full")
        return True

    def lone_datagram_header(self, size: int) -> bytes | None:
        """The datagram lane: the frame header for a packet of ``size`` bytes that may go
        out alone now (tunnel open, nothing queued, in bounds); None: send_datagram it."""
        if self._state is not TunnelState.OPEN or self.scheduler.has_output:
            return None
        return datagram_header(size) if 0 < size <= self._max_datagram else None

    def receive_lone_datagram(self, payload: bytes, now: float) -> bool:
        """The datagram lane: a payload of exactly one DATAGRAM frame, in an open tunnel with
        a datagram sink, goes to the sink at once (as receive_payload would take it, minus
        the frame decoder); False, nothing done: receive_payload it."""
        if self._state is not TunnelState.OPEN or self.datagrams.sink is None:
            return False
        packet = lone_datagram(payload)
        if packet is None:
            return False
        self._keepalive.last_received = now
        self.datagrams.receive_all([packet])
        return True

    def register(self, nodes: Iterable[str], prefixes: Iterable[str]) -> None:
        """(initiator) Announce the whole set of nodes and prefixes we serve."""
        self._move(TunnelInput.SEND_REGISTRATION)
        if not self._initiator:
            raise LocalProtocolError("only the initiator (agent) registers")
        nodes, prefixes = list(nodes), list(prefixes)
        if len(nodes) + len(prefixes) > self._limits.max_registration_entries:
            raise LocalProtocolError("registration exceeds max_registration_entries")
        for frame in encode_register(nodes, prefixes, self.chunk_bytes):
            self._queue_control(frame)

    def answer_registration(self, frames: Iterable[bytes]) -> None:
        """(responder) Tell the agent what it may serve and what was refused, and why: the
        REGISTER_RESULT frames of ``encode_register_result(..., self.chunk_bytes)``."""
        self._move(TunnelInput.SEND_REGISTRATION)
        if self._initiator:
            raise LocalProtocolError("only the responder (gateway) answers a registration")
        self._queue_peer_induced(list(frames))

    # ------------------------------------------------------------------ tunnel lifecycle

    def go_away(self, code: CloseCode, reason: str, now: float) -> None:
        """Drain: no new streams either way; open ones get drain_timeout_s to finish."""
        if self._state in (TunnelState.DRAINING_LOCAL, TunnelState.DRAINING_BOTH):
            return
        self._move(TunnelInput.SEND_GOAWAY)
        self._drain_deadline = now + self._limits.drain_timeout_s
        self._queue_control(encode_frame(GoAwayFrame(code, reason)))

    def close(self, code: CloseCode, reason: str) -> None:
        """Close the tunnel: a CLOSE frame is the last thing sent."""
        if self.closed:
            return
        confirmed = self._state is not TunnelState.HANDSHAKING
        self.abort(code, reason, by_peer=False)
        if confirmed:
            self._queue_control(encode_frame(CloseFrame(code, reason)))

    def abort(self, code: CloseCode, reason: str, *, by_peer: bool) -> None:
        """The tunnel is over: every stream is reset (TUNNEL_CLOSED), nothing more is
        sent or read, then ConnectionTerminated. Queue a CLOSE with :meth:`close`."""
        if self.closed:
            return
        self._move(TunnelInput.RECV_CLOSE if by_peer else TunnelInput.LOCAL_CLOSE)
        reason = clean_reason(reason)
        for stream in self._table.clear():
            self.events.append(
                StreamReset(stream.stream_id, StreamCode.TUNNEL_CLOSED, reason, by_peer=False)
            )
            self.stats.count_reset(StreamCode.TUNNEL_CLOSED.label)
        self.scheduler.clear()
        self.backlog.clear()
        self.events.append(ConnectionTerminated(code, reason, by_peer))

    def confirm(self, now: float) -> None:
        """The channel is established (keys confirmed): the tunnel opens and keepalive
        starts from ``now``."""
        self._move(TunnelInput.LOCAL_CONFIRMED)
        self._keepalive.start(now)

    def get_timer(self) -> float | None:
        if self._state is TunnelState.HANDSHAKING or self.closed:
            return None
        timer = self._keepalive.deadline()
        if self._drain_deadline is not None:
            timer = min(timer, self._drain_deadline)
        return timer

    def handle_timer(self, now: float) -> None:
        if self._state is TunnelState.HANDSHAKING or self.closed:
            return
        keepalive = self._keepalive
        if keepalive.dead(now):
            reason = f"nothing heard from the peer for {keepalive.dead_after_s:g}s"
            self.close(CloseCode.KEEPALIVE_TIMEOUT, reason)
            return
        if keepalive.ping_due(now):
            self._queue_control(encode_frame(PingFrame(keepalive.ping(now))))
        if self._drain_deadline is not None and now >= self._drain_deadline:
            self._drain_deadline = None
            for stream in list(self._table.streams.values()):
                self._send_reset(stream, StreamCode.DRAINING, "drain timeout")
                self.events.append(
                    StreamReset(stream.stream_id, StreamCode.DRAINING, "drain timeout", False)
                )

    # ------------------------------------------------------------------ output

    def _queue_control(self, frame: bytes) -> None:
        self.scheduler.queue_control(frame)

    def _queue_peer_induced(self, frames: Iterable[bytes]) -> None:
        """Queue replies the peer asked for; a peer that does not read them while it
        keeps asking gets the tunnel closed (the queue holds one whole answer at most
        beyond the cap: a large registration's answer is never cut)."""
        if self.scheduler.control_bytes > MAX_PEER_INDUCED_CONTROL_BYTES:
            self.close(CloseCode.LIMIT_EXCEEDED, "peer makes us queue too many control frames")
            return
        for frame in frames:
            self.scheduler.queue_control(frame)

    def next_payload(self) -> bytes | None:
        """The frames payload of the next record (at most MAX_RECORD_PAYLOAD_BYTES), or None."""
        return self.scheduler.next_payload()

    def _on_end_sent(self, stream: Stream) -> None:
        if stream.finished:
            finish_stream(stream, self._table, self.events)

    # ------------------------------------------------------------------ input

    def receive_payload(self, payload: bytes, now: float, *, act: bool = True) -> None:
        """Queue the frames payload of one record, then (``act``) act on the next of the
        frames waiting (raven.protocol.frame_backlog). Raises RemoteProtocolError."""
        if self.closed:
            return
        if self._state is not TunnelState.OPEN:  # OPEN + RECV_FRAMES stays OPEN (the table)
            self._move(TunnelInput.RECV_FRAMES)
        self._keepalive.last_received = now
        if not self.backlog.pending and (data := lone_data(payload)) is not None:
            return self.backlog.act_on_data(*data)  # nothing waits before it: order is kept
        packets = split_datagrams(payload)  # the L3 fast path (DATAGRAM frames only)
        if packets is not None:
            return self.datagrams.receive_all(packets)
        frames = parse_frames(payload)
        if len(frames) != 1 or type(frames[0]) is not DataFrame:
            over = self._budget.charge(frames, len(payload), now)
            if over is not None:  # before any of it is acted on
                self.stats.control_budget_exceeded += 1
                self.close(CloseCode.LIMIT_EXCEEDED, over)
                return
        self.backlog.extend(frames)
        if act:
            self.backlog.act(now)

    def resume_input(self, now: float) -> None:
        """Act on more of the frames that wait (raven.protocol.frame_backlog)."""
        self.backlog.act(now)

    def _on_data(self, stream_id: int, data: bytes) -> None:
        stream = self._table.peer(stream_id)
        if stream is None:
            return
        stream.apply(_I.RECV_DATA)
        size = len(data)
        if not stream.on_data(size):
            reason = "stream window exceeded"
            self._send_reset(stream, StreamCode.PROTOCOL_ERROR, reason)
            self.events.append(
                StreamReset(stream_id, StreamCode.PROTOCOL_ERROR, reason, by_peer=False)
            )
            return
        if size:
            self._table.buffered += size
            self.events.append(StreamDataReceived(stream_id, data))

    def _on_control(self, frame: Frame, now: float) -> None:
        if isinstance(frame, OpenFrame):
            self._on_open(frame)
        elif isinstance(frame, CreditFrame | EndFrame | ResetFrame | OpenResultFrame):
            apply_stream_control(frame, self._table, self.events, self.stats)
        elif isinstance(frame, DatagramFrame):
            self.datagrams.receive(frame.data)
        elif isinstance(frame, PingFrame):
            self._queue_peer_induced([encode_frame(PongFrame(frame.opaque))])
        elif isinstance(frame, PongFrame):
            rtt_s = self._keepalive.pong(frame.opaque, now)
            if rtt_s is not None:
                self.events.append(PongReceived(rtt_s))
        elif isinstance(frame, RegisterFrame | RegisterResultFrame):
            registration = self._registration.feed(frame)
            if registration is not None:
                self.events.append(registration)
        elif isinstance(frame, ReplicaFrame):
            self.events.append(self.replica.receive(frame))
        elif isinstance(frame, GoAwayFrame):
            if self._state not in (TunnelState.DRAINING_REMOTE, TunnelState.DRAINING_BOTH):
                self._move(TunnelInput.RECV_GOAWAY)
                self.events.append(GoAwayReceived(frame.code, frame.reason))
        elif isinstance(frame, CloseFrame):
            self.abort(frame.code, frame.reason, by_peer=True)

    def _on_open(self, frame: OpenFrame) -> None:
        stream_id = frame.stream_id
        self._table.take_peer_id(stream_id)
        code, window, reason = StreamCode.OK, 0, ""
        if self.draining:
            code, reason = StreamCode.DRAINING, "tunnel is draining"
        else:
            window, reason = self._table.window_for_new_stream()
            if reason:
                code = StreamCode.BUSY
            elif len(frame.data) > window:
                code, reason = StreamCode.PROTOCOL_ERROR, "OPEN data exceeds the stream window"
        if code is not StreamCode.OK:
            self._queue_peer_induced([encode_frame(OpenResultFrame(stream_id, code, reason))])
            return
        stream = self._table.add(stream_id, window, received=len(frame.data))
        stream.apply(_I.RECV_OPEN)
        self.events.append(StreamOpened(stream_id, frame.node, frame.port))
        if frame.data:  # received already: the window we grant at accept covers it
            self.events.append(StreamDataReceived(stream_id, frame.data))
