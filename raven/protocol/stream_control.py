"""What the peer's frames for an existing stream do: CREDIT, END, RESET and OPEN_RESULT
applied to the stream's state machine, and the events they produce.

The multiplexer's receive side for streams (:mod:`raven.protocol.mux` decodes and
dispatches; OPEN, which makes a stream, stays there). A frame for a stream that is gone
(reset or closed meanwhile: a race with the peer) is ignored.
"""

from __future__ import annotations

from raven.protocol.codes import StreamCode
from raven.protocol.event_queue import EventQueue
from raven.protocol.events import (
    StreamAccepted,
    StreamClosed,
    StreamEnded,
    StreamRefused,
    StreamReset,
    StreamWindowOpened,
)
from raven.protocol.frames import CreditFrame, EndFrame, OpenResultFrame, ResetFrame
from raven.protocol.stats import TunnelStats
from raven.protocol.stream_table import StreamTable
from raven.protocol.streams import SENDING_STATES, Stream, StreamInput

__all__ = ["StreamControlFrame", "apply_stream_control", "finish_stream"]

StreamControlFrame = CreditFrame | EndFrame | ResetFrame | OpenResultFrame

_I = StreamInput


def finish_stream(stream: Stream, table: StreamTable, events: EventQueue) -> None:
    """A cleanly closed stream: both ENDs are through."""
    table.forget(stream)
    events.append(StreamClosed(stream.stream_id))


def apply_stream_control(
    frame: StreamControlFrame, table: StreamTable, events: EventQueue, stats: TunnelStats
) -> None:
    """Apply the peer's ``frame`` to its stream (an illegal move raises RemoteProtocolError)."""
    stream = table.peer(frame.stream_id)
    if stream is None:
        return
    stream_id = frame.stream_id
    if isinstance(frame, CreditFrame):
        stream.apply(_I.RECV_CREDIT)
        stream.on_credit(frame.increment)
        if stream.state in SENDING_STATES:
            events.append(StreamWindowOpened(stream_id))
    elif isinstance(frame, EndFrame):
        stream.apply(_I.RECV_END)
        events.append(StreamEnded(stream_id))
        if stream.finished:
            finish_stream(stream, table, events)
    elif isinstance(frame, ResetFrame):
        stream.apply(_I.RECV_RESET)
        stream.discard_queue()
        stats.count_reset(frame.code.label)
        table.forget(stream)
        events.append(StreamReset(stream_id, frame.code, frame.reason, by_peer=True))
    elif frame.code is StreamCode.OK:
        stream.apply(_I.RECV_ACCEPT)
        events.append(StreamAccepted(stream_id))
    else:
        stream.apply(_I.RECV_REFUSE)
        table.forget(stream)
        events.append(StreamRefused(stream_id, frame.code, frame.reason))
