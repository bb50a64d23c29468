"""The stream state machine (one table) and per-stream credit accounting.

Every stream walks :data:`TRANSITIONS`. Inputs named ``SEND_*`` are our own
calls: an illegal one raises :class:`LocalProtocolError`. Inputs named
``RECV_*`` are the peer's frames: an illegal one raises
:class:`RemoteProtocolError`. The multiplexer drops a stream once it is
``CLOSED`` and nothing of it is left to send.

Flow control (after HTTP/2 and httpcore): a stream starts with no credit in
either direction. Each side grants its receive window with a CREDIT frame when
the stream opens (the opener right after OPEN, the acceptor right after its
OPEN_RESULT). Data received beyond what was granted resets that stream with
PROTOCOL_ERROR. Credit goes back to the sender only when the application
reports that it consumed the data, in increments of at least
``window * credit_update_ratio``.
"""

from __future__ import annotations

from collections import deque

from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.lifecycle import TableEnum, illegal_move


class StreamState(TableEnum):
    IDLE = "idle"  # no frame yet (the start of the table)
    OPEN_SENT = "open_sent"  # we sent OPEN, waiting for OPEN_RESULT
    OPEN_RECEIVED = "open_received"  # the peer sent OPEN, we have not answered
    OPEN = "open"  # data both ways
    HALF_CLOSED_LOCAL = "half_closed_local"  # we sent END; the peer may still send
    HALF_CLOSED_REMOTE = "half_closed_remote"  # the peer sent END; we may still send
    CLOSED = "closed"  # done (cleanly, refused or reset)


class StreamInput(TableEnum):
    SEND_OPEN = "send_open"
    SEND_ACCEPT = "send_accept"
    SEND_REFUSE = "send_refuse"
    SEND_DATA = "send_data"
    SEND_CREDIT = "send_credit"
    SEND_END = "send_end"
    SEND_RESET = "send_reset"
    RECV_OPEN = "recv_open"
    RECV_ACCEPT = "recv_accept"
    RECV_REFUSE = "recv_refuse"
    RECV_DATA = "recv_data"
    RECV_CREDIT = "recv_credit"
    RECV_END = "recv_end"
    RECV_RESET = "recv_reset"

    @property
    def local(self) -> bool:
        return self.name.startswith("SEND_")


_S = StreamState
_I = StreamInput

#: (state, input) -> next state. Anything missing is illegal.
TRANSITIONS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_S.IDLE, _I.SEND_OPEN): _S.OPEN_SENT,
    (_S.IDLE, _I.RECV_OPEN): _S.OPEN_RECEIVED,
    # we opened, waiting for the answer; our window grant follows our OPEN
    (_S.OPEN_SENT, _I.SEND_CREDIT): _S.OPEN_SENT,
    (_S.OPEN_SENT, _I.RECV_ACCEPT): _S.OPEN,
    (_S.OPEN_SENT, _I.RECV_REFUSE): _S.CLOSED,
    (_S.OPEN_SENT, _I.SEND_RESET): _S.CLOSED,
    (_S.OPEN_SENT, _I.RECV_RESET): _S.CLOSED,
    # the peer opened, the application decides
    (_S.OPEN_RECEIVED, _I.RECV_CREDIT): _S.OPEN_RECEIVED,
    (_S.OPEN_RECEIVED, _I.SEND_ACCEPT): _S.OPEN,
    (_S.OPEN_RECEIVED, _I.SEND_REFUSE): _S.CLOSED,
    (_S.OPEN_RECEIVED, _I.SEND_RESET): _S.CLOSED,
    (_S.OPEN_RECEIVED, _I.RECV_RESET): _S.CLOSED,
    # both directions open
    (_S.OPEN, _I.SEND_DATA): _S.OPEN,
    (_S.OPEN, _I.RECV_DATA): _S.OPEN,
    (_S.OPEN, _I.SEND_CREDIT): _S.OPEN,
    (_S.OPEN, _I.RECV_CREDIT): _S.OPEN,
    (_S.OPEN, _I.SEND_END): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.RECV_END): _S.HALF_CLOSED_REMOTE,
    (_S.OPEN, _I.SEND_RESET): _S.CLOSED,
    (_S.OPEN, _I.RECV_RESET): _S.CLOSED,
    # we finished sending; still receiving
    (_S.HALF_CLOSED_LOCAL, _I.RECV_DATA): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_LOCAL, _I.SEND_CREDIT): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_CREDIT): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_END): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.SEND_RESET): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_RESET): _S.CLOSED,
    # the peer finished sending; we still send
    (_S.HALF_CLOSED_REMOTE, _I.SEND_DATA): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_REMOTE, _I.RECV_CREDIT): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_END): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_RESET): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.RECV_RESET): _S.CLOSED,
    # closed, but our data and END may still be queued: the peer may still grant
    # credit for them or reset, and we may still abort (the queue is dropped)
    (_S.CLOSED, _I.RECV_CREDIT): _S.CLOSED,
    (_S.CLOSED, _I.RECV_RESET): _S.CLOSED,
    (_S.CLOSED, _I.SEND_RESET): _S.CLOSED,
}

#: States in which we may send DATA (and so have use for credit).
SENDING_STATES = frozenset({StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE})
#: States in which the peer may send DATA (and so has use for our credit).
RECEIVING_STATES = frozenset({StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL})

#: Largest credit a sender may hold (2^32 - 1, the CREDIT field); more is a protocol error.
MAX_SEND_CREDIT = 0xFFFFFFFF


class Stream:
    """One stream: its state, both credit directions and its send queue."""

    __slots__ = (
        "buffered",
        "bulk",
        "consumed_ungranted",
        "end_pending",
        "end_sent",
        "queue",
        "queued_bytes",
        "recv_granted",
        "recv_total",
        "scheduled",
        "send_credit",
        "state",
        "stream_id",
        "window",
    )

    def __init__(self, stream_id: int, window: int) -> None:
        self.stream_id = stream_id
        self.state = StreamState.IDLE
        #: our receive window (bytes granted to the peer at open, kept topped up)
        self.window = window
        #: bytes the peer still lets us send (below zero while the grant that covers the data
        #: our OPEN carried has not come)
        self.send_credit = 0
        #: bytes we let the peer send, in total, and bytes it sent, in total
        self.recv_granted = 0
        self.recv_total = 0
        #: received, not yet consumed by the application
        self.buffered = 0
        #: consumed by the application, not yet granted back
        self.consumed_ungranted = 0
        #: data accepted from the application, not yet framed
        self.queue: deque[memoryview] = deque()
        self.queued_bytes = 0
        #: the application called end_stream; END goes out once the queue is empty
        self.end_pending = False
        self.end_sent = False
        #: in the multiplexer's round-robin ring
        self.scheduled = False
        #: low priority (backfill): sent when no other stream has data (raven.protocol.scheduler)
        self.bulk = False

    def apply(self, event: StreamInput) -> StreamState:
        """Move by the table; raises Local/RemoteProtocolError on an illegal transition."""
        state = TRANSITIONS.get((self.state, event))
        if state is None:
            raise illegal_move("stream", self.state, event)
        self.state = state
        return state

    # ------------------------------------------------------------------ receive side

    def grant_window(self) -> int:
        """The initial grant (sent as CREDIT when the stream opens)."""
        self.recv_granted += self.window
        return self.window

    def on_data(self, size: int) -> bool:
        """Account ``size`` received bytes; False if the peer exceeded its credit."""
        self.recv_total += size
        if self.recv_total > self.recv_granted:
            return False
        self.buffered += size
        return True

    def on_open_data(self, size: int) -> None:
        """The peer's OPEN carried ``size`` bytes (checked against the window by the caller):
        received before the grant that covers them goes out."""
        self.recv_total += size
        self.buffered += size

    def on_consumed(self, size: int, ratio: float, *, grant: bool = True) -> int:
        """The application read ``size`` bytes; returns the credit to grant now (or 0).
        ``grant``: False while no CREDIT may go out (not accepted yet, or the peer ended); the
        bytes are granted back with a later consumption."""
        if size < 0 or size > self.buffered:
            raise LocalProtocolError(
                f"consumed {size} bytes but {self.buffered} are buffered on stream {self.stream_id}"
            )
        self.buffered -= size
        self.consumed_ungranted += size
        if grant and self.consumed_ungranted >= max(1, int(self.window * ratio)):
            increment = self.consumed_ungranted
            self.consumed_ungranted = 0
            self.recv_granted += increment
            return increment
        return 0

    # ------------------------------------------------------------------ send side

    def on_credit(self, increment: int) -> None:
        self.send_credit += increment
        if self.send_credit > MAX_SEND_CREDIT:
            raise RemoteProtocolError(f"credit overflow on stream {self.stream_id}")

    def enqueue(self, data: bytes | bytearray | memoryview) -> None:
        size = len(data)
        if size > self.send_credit:
            raise LocalProtocolError(
                f"{size} bytes exceed the {self.send_credit} bytes of credit "
                f"on stream {self.stream_id}"
            )
        # the caller may reuse a mutable buffer: keep our own copy of one
        view = memoryview(data if isinstance(data, bytes) else bytes(data))
        self.send_credit -= size
        self.queue.append(view)
        self.queued_bytes += size

    def take(self, size: int) -> list[memoryview]:
        """Remove up to ``size`` queued bytes, as zero-copy slices."""
        pieces: list[memoryview] = []
        queue = self.queue
        while size > 0 and queue:
            head = queue[0]
            if len(head) <= size:
                queue.popleft()
                pieces.append(head)
                size -= len(head)
                self.queued_bytes -= len(head)
            else:
                pieces.append(head[:size])
                queue[0] = head[size:]
                self.queued_bytes -= size
                size = 0
        return pieces

    def discard_queue(self) -> None:
        self.queue.clear()
        self.queued_bytes = 0
        self.end_pending = False

    @property
    def has_output(self) -> bool:
        """Data or an END frame waiting for the scheduler."""
        return self.queued_bytes > 0 or (self.end_pending and not self.end_sent)

    @property
    def finished(self) -> bool:
        """CLOSED and nothing left to send: the multiplexer may forget it."""
        return self.state is StreamState.CLOSED and not self.has_output
