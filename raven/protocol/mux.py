"""Multiplexer: frames <-> streams, the fair scheduler, keepalive, drain, registration.

Sans-IO over plaintext record payloads: :meth:`Multiplexer.receive_payload`
takes the frames payload of one record, :meth:`Multiplexer.next_payload`
produces the next one to seal (at most ``MAX_RECORD_PAYLOAD_BYTES``
bytes). Events come out of :meth:`Multiplexer.next_event`. The peer's
violations raise :class:`RemoteProtocolError` (the caller then calls
:meth:`Multiplexer.abort`); our own illegal calls raise
:class:`LocalProtocolError`.

Sending order inside a payload: control frames (OPEN, CREDIT, RESET, PONG...)
first, then datagrams (at most half the payload while streams wait), then
stream data by deficit round robin with a quantum of
``limits.max_frame_payload_bytes``, so one busy stream cannot starve the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from raven.protocol.budget import ControlBudget
from raven.protocol.codes import CloseCode, StreamCode
from raven.protocol.constants import MAX_FRAME_PAYLOAD_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import (
    ConnectionTerminated,
    DatagramReceived,
    Event,
    GoAwayReceived,
    PongReceived,
    RegistrationAnswered,
    RegistrationReceived,
    StreamAccepted,
    StreamClosed,
    StreamDataReceived,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamReset,
    StreamWindowOpened,
)
from raven.protocol.frame_fields import clean_reason
from raven.protocol.frames import (
    MAX_STREAM_ID,
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
    ResetFrame,
    encode_frame,
    encode_register,
    encode_register_result,
    parse_frames,
)
from raven.protocol.lifecycle import DRAINING_STATES, TunnelInput, TunnelState, next_tunnel_state
from raven.protocol.limits import Limits
from raven.protocol.scheduler import Scheduler, TunnelStats
from raven.protocol.streams import (
    RECEIVING_STATES,
    SENDING_STATES,
    Stream,
    StreamInput,
    StreamState,
)

__all__ = ["Multiplexer", "TunnelStats"]

#: Control bytes the peer may make us queue (PONGs, refusals, registration answers)
#: before it must read them; beyond it the tunnel is closed (LIMIT_EXCEEDED).
MAX_PEER_INDUCED_CONTROL_BYTES = 1024 * 1024
#: Smallest receive window a stream is given when the tunnel's windows are nearly all
#: committed; every stream up to ``max_streams`` is guaranteed at least this much.
MIN_STREAM_WINDOW_BYTES = 16 * 1024
#: PINGs awaiting their PONG that we remember (for RTT).
_MAX_PINGS_IN_FLIGHT = 4

_I = StreamInput


class Multiplexer:
    """Streams, datagrams, keepalive and registration over record payloads.

    ``initiator`` decides the stream id parity (initiator odd, responder even)
    and who may register (the initiator registers, the responder answers).
    """

    def __init__(self, *, initiator: bool, limits: Limits, now: float) -> None:
        self._limits = limits
        self._initiator = initiator
        self._streams: dict[int, Stream] = {}
        self._next_local_id = 1 if initiator else 2
        self._last_peer_id = 0
        self.stats = TunnelStats()
        self._out = Scheduler(limits.max_frame_payload_bytes, self.stats, self._on_end_sent)
        self._chunk_bytes = max(1024, min(limits.max_frame_payload_bytes, MAX_FRAME_PAYLOAD_BYTES))
        self._max_datagram = min(limits.max_datagram_bytes, MAX_FRAME_PAYLOAD_BYTES)
        self._events: deque[Event] = deque()
        self._buffered = 0
        #: receive windows of the live streams, summed: the most the peer can make us
        #: buffer (held under max_tunnel_buffered_bytes, for streams either side opened)
        self._reserved = 0
        #: the tunnel's lifecycle (raven.protocol.lifecycle.TUNNEL_TRANSITIONS)
        self._state = TunnelState.HANDSHAKING
        self._drain_deadline: float | None = None
        self._last_received = now
        self._next_ping = now + limits.keepalive_interval_s
        self._pings: dict[bytes, float] = {}
        self._ping_counter = 0
        self._rtt_s: float | None = None
        self._reg: tuple[list[str], list[str], list[tuple[str, str]]] = ([], [], [])
        self._budget = ControlBudget(limits, now)

    # ------------------------------------------------------------------ properties

    @property
    def state(self) -> TunnelState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state is TunnelState.CLOSED

    @property
    def draining(self) -> bool:
        """GOAWAY was sent or received: no new streams either way."""
        return self._state in DRAINING_STATES

    def _move(self, event: TunnelInput) -> TunnelState:
        self._state = next_tunnel_state(self._state, event)
        return self._state

    @property
    def rtt_s(self) -> float | None:
        """Latest PING/PONG round-trip time, None before the first PONG."""
        return self._rtt_s

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received on streams and not yet consumed by the application."""
        return self._buffered

    @property
    def has_output(self) -> bool:
        return self._out.has_output

    def stream_state(self, stream_id: int) -> StreamState | None:
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.state

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def add_event(self, event: Event) -> None:
        """Queue an event produced by the layer above (e.g. HandshakeCompleted)."""
        self._events.append(event)

    # ------------------------------------------------------------------ streams: our calls

    def _stream(self, stream_id: int) -> Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"no stream {stream_id}")
        return stream

    def open_stream(self, node: str, port: int) -> int:
        """Ask the peer for a stream to ``node``:``port``; StreamAccepted or
        StreamRefused follows (StreamRefused BUSY at once when max_streams is reached)."""
        self._move(TunnelInput.SEND_OPEN_STREAM)
        stream_id = self._next_local_id
        if stream_id > MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted on this tunnel")
        open_frame = encode_frame(OpenFrame(stream_id, node, port))  # validates node/port
        self._next_local_id += 2
        window, busy = self._window_for_new_stream()
        if busy:
            self._events.append(StreamRefused(stream_id, StreamCode.BUSY, busy))
            return stream_id
        stream = self._new_stream(stream_id, window)
        stream.apply(_I.SEND_OPEN)
        self._queue_control(open_frame)
        self._grant_window(stream)
        self.stats.streams_opened += 1
        return stream_id

    def accept_stream(self, stream_id: int) -> None:
        stream = self._stream(stream_id)
        stream.apply(_I.SEND_ACCEPT)
        self._queue_control(encode_frame(OpenResultFrame(stream_id, StreamCode.OK)))
        self._grant_window(stream)
        self.stats.streams_opened += 1

    def refuse_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        if code is StreamCode.OK:
            raise LocalProtocolError("refuse_stream needs a code other than OK")
        stream = self._stream(stream_id)
        stream.apply(_I.SEND_REFUSE)
        self._forget(stream)
        self._queue_peer_induced([encode_frame(OpenResultFrame(stream_id, code, reason))])

    def send_capacity(self, stream_id: int) -> int:
        """Bytes ``send_stream_data`` accepts now (0 for an unknown or finished stream)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state not in SENDING_STATES:
            return 0
        return stream.send_credit

    def send_stream_data(self, stream_id: int, data: bytes | bytearray | memoryview) -> None:
        stream = self._stream(stream_id)
        stream.apply(_I.SEND_DATA)
        if not data:
            return
        stream.enqueue(data)
        self._schedule(stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close: END goes out after the data already queued."""
        stream = self._stream(stream_id)
        stream.apply(_I.SEND_END)
        stream.end_pending = True
        self._schedule(stream)

    def reset_stream(self, stream_id: int, code: StreamCode, reason: str = "") -> None:
        """Abort a stream; a no-op for a stream that is already gone (races with the peer)."""
        stream = self._streams.get(stream_id)
        if stream is None or self.closed:
            return
        self._send_reset(stream, code, reason)

    def consume_stream_data(self, stream_id: int, size: int) -> None:
        """The application read ``size`` bytes of the stream: credit may flow back."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # reset or closed meanwhile; its bytes were already released
        increment = stream.on_consumed(size, self._limits.credit_update_ratio)
        self._buffered -= size
        if increment and stream.state in RECEIVING_STATES and not self.closed:
            stream.apply(_I.SEND_CREDIT)
            self._queue_control(encode_frame(CreditFrame(stream_id, increment)))

    def _grant_window(self, stream: Stream) -> None:
        stream.apply(_I.SEND_CREDIT)
        self._queue_control(encode_frame(CreditFrame(stream.stream_id, stream.grant_window())))

    def _send_reset(self, stream: Stream, code: StreamCode, reason: str) -> None:
        stream.apply(_I.SEND_RESET)
        stream.discard_queue()
        self._queue_control(encode_frame(ResetFrame(stream.stream_id, code, reason)))
        self._count_reset(code)
        self._forget(stream)

    def _count_reset(self, code: StreamCode) -> None:
        resets = self.stats.streams_reset
        resets[code.label] = resets.get(code.label, 0) + 1

    def _window_for_new_stream(self) -> tuple[int, str]:
        """(receive window, "") for a new stream, or (0, reason) when it must be refused.
        Windows shrink as the tunnel's total nears max_tunnel_buffered_bytes, keeping
        MIN_STREAM_WINDOW_BYTES for each stream still allowed under max_streams."""
        limits = self._limits
        others = limits.max_streams - len(self._streams) - 1
        if others < 0:
            return 0, "too many streams"
        floor = min(MIN_STREAM_WINDOW_BYTES, limits.stream_window_bytes)
        room = limits.max_tunnel_buffered_bytes - self._reserved - others * floor
        window = min(limits.stream_window_bytes, room)
        if window < floor:
            return 0, "too much data buffered on the tunnel"
        return window, ""

    def _new_stream(self, stream_id: int, window: int) -> Stream:
        stream = Stream(stream_id, window)
        self._streams[stream_id] = stream
        self._reserved += window
        return stream

    def _forget(self, stream: Stream) -> None:
        if self._streams.pop(stream.stream_id, None) is not None:
            self._buffered -= stream.buffered
            self._reserved -= stream.window
            stream.buffered = 0

    def _schedule(self, stream: Stream) -> None:
        self._out.schedule(stream)

    # ------------------------------------------------------------------ datagrams, registration

    def send_datagram(self, data: bytes) -> bool:
        """Queue one L3 packet; False (dropped, counted) when oversize, queue full or closed."""
        if self.closed:
            return self._drop("closed")
        if not data or len(data) > self._max_datagram:
            return self._drop("oversize")
        if self._out.queued_datagrams >= self._limits.max_queued_datagrams:
            return self._drop("queue_full")
        if self._out.datagram_bytes + len(data) > self._limits.max_queued_datagram_bytes:
            return self._drop("queue_full")
        self._out.queue_datagram(bytes(data))
        return True

    def _drop(self, reason: str) -> bool:
        drops = self.stats.datagrams_dropped
        drops[reason] = drops.get(reason, 0) + 1
        return False

    def register(self, nodes: Iterable[str], prefixes: Iterable[str]) -> None:
        """(initiator) Announce the whole set of nodes and prefixes we serve."""
        self._move(TunnelInput.SEND_REGISTRATION)
        if not self._initiator:
            raise LocalProtocolError("only the initiator (agent) registers")
        nodes, prefixes = list(nodes), list(prefixes)
        if len(nodes) + len(prefixes) > self._limits.max_registration_entries:
            raise LocalProtocolError("registration exceeds max_registration_entries")
        for frame in encode_register(nodes, prefixes, self._chunk_bytes):
            self._queue_control(frame)

    def answer_registration(
        self,
        accepted_nodes: Iterable[str],
        accepted_prefixes: Iterable[str],
        refused: Iterable[tuple[str, str]] = (),
    ) -> None:
        """(responder) Tell the agent what it may serve and what was refused, and why."""
        self._move(TunnelInput.SEND_REGISTRATION)
        if self._initiator:
            raise LocalProtocolError("only the responder (gateway) answers a registration")
        frames = encode_register_result(
            accepted_nodes, accepted_prefixes, refused, self._chunk_bytes
        )
        self._queue_peer_induced(frames)

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
        for stream in list(self._streams.values()):
            self._events.append(
                StreamReset(stream.stream_id, StreamCode.TUNNEL_CLOSED, reason, by_peer=False)
            )
            self._count_reset(StreamCode.TUNNEL_CLOSED)
        self._streams.clear()
        self._buffered = 0
        self._reserved = 0
        self._out.clear()
        self._events.append(ConnectionTerminated(code, reason, by_peer))

    def confirm(self, now: float) -> None:
        """The channel is established (keys confirmed): the tunnel opens and keepalive
        starts from ``now``."""
        self._move(TunnelInput.LOCAL_CONFIRMED)
        self._last_received = now
        self._next_ping = now + self._limits.keepalive_interval_s

    def get_timer(self) -> float | None:
        if self._state is TunnelState.HANDSHAKING or self.closed:
            return None
        timer = min(self._next_ping, self._last_received + self._limits.dead_peer_timeout_s)
        if self._drain_deadline is not None:
            timer = min(timer, self._drain_deadline)
        return timer

    def handle_timer(self, now: float) -> None:
        if self._state is TunnelState.HANDSHAKING or self.closed:
            return
        limits = self._limits
        if now >= self._last_received + limits.dead_peer_timeout_s:
            reason = f"nothing heard from the peer for {limits.dead_peer_timeout_s:g}s"
            self.close(CloseCode.KEEPALIVE_TIMEOUT, reason)
            return
        if now >= self._next_ping:
            self._send_ping(now)
        if self._drain_deadline is not None and now >= self._drain_deadline:
            self._drain_deadline = None
            for stream in list(self._streams.values()):
                self._send_reset(stream, StreamCode.DRAINING, "drain timeout")
                self._events.append(
                    StreamReset(stream.stream_id, StreamCode.DRAINING, "drain timeout", False)
                )

    def _send_ping(self, now: float) -> None:
        self._ping_counter += 1
        opaque = self._ping_counter.to_bytes(8, "big")
        self._pings[opaque] = now
        while len(self._pings) > _MAX_PINGS_IN_FLIGHT:
            del self._pings[next(iter(self._pings))]
        self._queue_control(encode_frame(PingFrame(opaque)))
        self._next_ping = now + self._limits.keepalive_interval_s

    # ------------------------------------------------------------------ output

    def _queue_control(self, frame: bytes) -> None:
        self._out.queue_control(frame)

    def _queue_peer_induced(self, frames: Iterable[bytes]) -> None:
        """Queue replies the peer asked for; a peer that does not read them while it
        keeps asking gets the tunnel closed (the queue holds one whole answer at most
        beyond the cap: a large registration's answer is never cut)."""
        if self._out.control_bytes > MAX_PEER_INDUCED_CONTROL_BYTES:
            self.close(CloseCode.LIMIT_EXCEEDED, "peer makes us queue too many control frames")
            return
        for frame in frames:
            self._out.queue_control(frame)

    def next_payload(self) -> bytes | None:
        """The frames payload of the next record (at most MAX_RECORD_PAYLOAD_BYTES), or None."""
        return self._out.next_payload()

    def _on_end_sent(self, stream: Stream) -> None:
        if stream.finished:
            self._finish(stream)

    def _finish(self, stream: Stream) -> None:
        """A cleanly closed stream: both ENDs are through."""
        self._forget(stream)
        self._events.append(StreamClosed(stream.stream_id))

    # ------------------------------------------------------------------ input

    def receive_payload(self, payload: bytes, now: float) -> None:
        """Handle the frames payload of one record. Raises RemoteProtocolError."""
        if self.closed:
            return
        self._move(TunnelInput.RECV_FRAMES)
        self._last_received = now
        received = self.stats.frames_received
        frames = parse_frames(payload)
        if len(frames) != 1 or type(frames[0]) is not DataFrame:
            over = self._budget.charge(frames, len(payload), now)
            if over is not None:  # before any of it is acted on
                self.stats.control_budget_exceeded += 1
                self.close(CloseCode.LIMIT_EXCEEDED, over)
                return
        for frame in frames:
            if self.closed:
                return
            if type(frame) is DataFrame:
                received["data"] = received.get("data", 0) + 1
                self._on_data(frame)
                continue
            label = frame.TYPE.label
            received[label] = received.get(label, 0) + 1
            self._on_control(frame, now)

    def _peer_stream(self, stream_id: int) -> Stream | None:
        """The stream a peer frame names; None for one that finished (late frames are
        ignored); RemoteProtocolError for one that never existed."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        ours = (stream_id & 1) == (1 if self._initiator else 0)
        known = stream_id < self._next_local_id if ours else stream_id <= self._last_peer_id
        if not known:
            raise RemoteProtocolError(f"frame for stream {stream_id}, which was never opened")
        return None

    def _on_data(self, frame: DataFrame) -> None:
        stream = self._peer_stream(frame.stream_id)
        if stream is None:
            return
        stream.apply(_I.RECV_DATA)
        size = len(frame.data)
        if not stream.on_data(size):
            reason = "stream window exceeded"
            self._send_reset(stream, StreamCode.PROTOCOL_ERROR, reason)
            self._events.append(
                StreamReset(frame.stream_id, StreamCode.PROTOCOL_ERROR, reason, by_peer=False)
            )
            return
        if size:
            self._buffered += size
            self._events.append(StreamDataReceived(frame.stream_id, frame.data))

    def _on_control(self, frame: Frame, now: float) -> None:
        if isinstance(frame, OpenFrame):
            self._on_open(frame)
        elif isinstance(frame, CreditFrame | EndFrame | ResetFrame | OpenResultFrame):
            self._on_stream_control(frame)
        elif isinstance(frame, DatagramFrame):
            if len(frame.data) > self._limits.max_datagram_bytes:
                self._drop("oversize_received")
                return
            self.stats.datagrams_received += 1
            self._events.append(DatagramReceived(frame.data))
        elif isinstance(frame, PingFrame):
            self._queue_peer_induced([encode_frame(PongFrame(frame.opaque))])
        elif isinstance(frame, PongFrame):
            sent_at = self._pings.pop(frame.opaque, None)
            if sent_at is not None:
                self._rtt_s = max(0.0, now - sent_at)
                self._events.append(PongReceived(self._rtt_s))
        elif isinstance(frame, RegisterFrame | RegisterResultFrame):
            self._on_registration(frame)
        elif isinstance(frame, GoAwayFrame):
            if self._state not in (TunnelState.DRAINING_REMOTE, TunnelState.DRAINING_BOTH):
                self._move(TunnelInput.RECV_GOAWAY)
                self._events.append(GoAwayReceived(frame.code, frame.reason))
        elif isinstance(frame, CloseFrame):
            self.abort(frame.code, frame.reason, by_peer=True)

    def _on_open(self, frame: OpenFrame) -> None:
        stream_id = frame.stream_id
        if (stream_id & 1) != (0 if self._initiator else 1):
            raise RemoteProtocolError(f"peer opened stream {stream_id} of the wrong parity")
        if stream_id <= self._last_peer_id:
            raise RemoteProtocolError(f"peer reused stream id {stream_id}")
        self._last_peer_id = stream_id
        code, window, reason = StreamCode.OK, 0, ""
        if self.draining:
            code, reason = StreamCode.DRAINING, "tunnel is draining"
        else:
            window, reason = self._window_for_new_stream()
            if reason:
                code = StreamCode.BUSY
        if code is not StreamCode.OK:
            self._queue_peer_induced([encode_frame(OpenResultFrame(stream_id, code, reason))])
            return
        stream = self._new_stream(stream_id, window)
        stream.apply(_I.RECV_OPEN)
        self._events.append(StreamOpened(stream_id, frame.node, frame.port))

    def _on_stream_control(
        self, frame: CreditFrame | EndFrame | ResetFrame | OpenResultFrame
    ) -> None:
        stream = self._peer_stream(frame.stream_id)
        if stream is None:
            return
        stream_id = frame.stream_id
        if isinstance(frame, CreditFrame):
            stream.apply(_I.RECV_CREDIT)
            stream.on_credit(frame.increment)
            if stream.state in SENDING_STATES:
                self._events.append(StreamWindowOpened(stream_id))
        elif isinstance(frame, EndFrame):
            stream.apply(_I.RECV_END)
            self._events.append(StreamEnded(stream_id))
            if stream.finished:
                self._finish(stream)
        elif isinstance(frame, ResetFrame):
            stream.apply(_I.RECV_RESET)
            stream.discard_queue()
            self._count_reset(frame.code)
            self._forget(stream)
            self._events.append(StreamReset(stream_id, frame.code, frame.reason, by_peer=True))
        elif frame.code is StreamCode.OK:
            stream.apply(_I.RECV_ACCEPT)
            self._events.append(StreamAccepted(stream_id))
        else:
            stream.apply(_I.RECV_REFUSE)
            self._forget(stream)
            self._events.append(StreamRefused(stream_id, frame.code, frame.reason))

    def _on_registration(self, frame: RegisterFrame | RegisterResultFrame) -> None:
        nodes, prefixes, refused = self._reg
        if isinstance(frame, RegisterFrame):
            if self._initiator:
                raise RemoteProtocolError("REGISTER sent to the initiator")
            nodes += frame.nodes
            prefixes += frame.prefixes
        else:
            if not self._initiator:
                raise RemoteProtocolError("REGISTER_RESULT sent to the responder")
            nodes += frame.accepted_nodes
            prefixes += frame.accepted_prefixes
            refused += frame.refused
        if len(nodes) + len(prefixes) + len(refused) > self._limits.max_registration_entries:
            raise RemoteProtocolError(
                "registration exceeds max_registration_entries", CloseCode.LIMIT_EXCEEDED
            )
        if not frame.final:
            return
        self._reg = ([], [], [])
        if isinstance(frame, RegisterFrame):
            self._events.append(RegistrationReceived(tuple(nodes), tuple(prefixes)))
        else:
            self._events.append(RegistrationAnswered(tuple(nodes), tuple(prefixes), tuple(refused)))
