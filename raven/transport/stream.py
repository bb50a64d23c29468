"""What L7 code is written against: a byte stream to an edge target, and who opens one.

The gateway's agent registry implements :class:`StreamOpener` over tunnels;
:class:`raven.transport.direct.DirectOpener` is its in-memory twin (plain TCP).
"""

from __future__ import annotations

import enum
from typing import Protocol

from raven.protocol.codes import StreamCode


class OpenFailure(enum.Enum):
    """Why a stream to an edge target could not be opened. Values are metric labels."""

    UNKNOWN_NODE = "unknown_node"  # no authorised agent ever registered this node
    NO_AGENT = "no_agent"  # the node is known but no agent serving it is connected
    PORT_NOT_ALLOWED = "port_not_allowed"  # outside the allow-list
    TARGET_REFUSED = "target_refused"  # the target refused the TCP connection
    TARGET_UNREACHABLE = (
        "target_unreachable"  # no route, host down, name not resolvable at the edge
    )
    TARGET_TIMEOUT = "target_timeout"  # connecting (or the whole open) took too long
    BUSY = "busy"  # too many streams / too much buffered on the tunnel
    DRAINING = "draining"  # the agent or gateway is shutting down
    TUNNEL_CLOSED = "tunnel_closed"  # the tunnel went away while opening
    INTERNAL = "internal"


#: How a refusal code from the peer maps to an open failure.
OPEN_FAILURE_BY_CODE: dict[StreamCode, OpenFailure] = {
    StreamCode.UNKNOWN_NODE: OpenFailure.UNKNOWN_NODE,
    StreamCode.PORT_NOT_ALLOWED: OpenFailure.PORT_NOT_ALLOWED,
    StreamCode.TARGET_REFUSED: OpenFailure.TARGET_REFUSED,
    StreamCode.TARGET_UNREACHABLE: OpenFailure.TARGET_UNREACHABLE,
    StreamCode.TARGET_TIMEOUT: OpenFailure.TARGET_TIMEOUT,
    StreamCode.BUSY: OpenFailure.BUSY,
    StreamCode.DRAINING: OpenFailure.DRAINING,
    StreamCode.TUNNEL_CLOSED: OpenFailure.TUNNEL_CLOSED,
}


class StreamOpenError(Exception):
    """A stream could not be opened; ``reason`` says why, ``detail`` is one human line."""

    def __init__(self, reason: OpenFailure, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


class StreamResetError(Exception):
    """The stream was aborted mid-way (target died, tunnel closed, peer reset)."""

    def __init__(self, code: StreamCode, reason: str = "") -> None:
        super().__init__(f"stream reset: {code.label}" + (f" ({reason})" if reason else ""))
        self.code = code
        self.reason = reason


class StreamReceiver(Protocol):
    """Takes an attached stream's events as callbacks (:meth:`ByteStream.attach`)."""

    def stream_data(self, data: bytes) -> None:
        """Bytes from the peer; call ``consumed(len(data))`` once they are taken."""
        ...

    def stream_eof(self) -> None:
        """The peer ended its side (END, or EOF for a plain TCP stream)."""
        ...

    def stream_reset(self, error: StreamResetError) -> None:
        """The stream was reset (by the peer, the tunnel closing or a drain)."""
        ...

    def stream_writable(self) -> None:
        """Send credit came back, or the tunnel's transport took its buffered bytes."""
        ...


class ByteStream(Protocol):
    """A bidirectional byte stream to one edge target.

    Read it with ``await read()``, or :meth:`attach` a :class:`StreamReceiver` and take its
    bytes as callbacks (flow control: :meth:`consumed`) until :meth:`detach`.
    """

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes``; ``b""`` on a clean end; :class:`StreamResetError` on abort."""
        ...

    async def write(self, data: bytes) -> None:
        """Send ``data``, waiting for flow-control credit (backpressure)."""
        ...

    def try_send(self, data: bytes) -> bool:
        """Send all of ``data`` now if flow control allows it, without waiting; False (and
        nothing sent) when it does not. Raises as ``write`` does on a broken stream."""
        ...

    def send_nowait(self, data: bytes | memoryview) -> int:
        """Send what flow control allows now; how many bytes of ``data`` went. Raises as
        ``write`` does on a broken stream."""
        ...

    @property
    def send_blocked(self) -> bool:
        """Nothing more may go now: the receiver's ``stream_writable`` says when it may."""
        ...

    async def write_eof(self) -> None:
        """Half-close: no more data from us."""
        ...

    def end(self) -> None:
        """Half-close now, without waiting (what ``write_eof`` does)."""
        ...

    def reset(self, code: StreamCode, reason: str = "") -> None:
        """Abort both directions now."""
        ...

    def attach(self, receiver: StreamReceiver) -> None:
        """Deliver bytes, END and reset to ``receiver`` from now on (what is buffered first)."""
        ...

    def detach(self) -> None:
        """Stop delivering to the receiver: later bytes are buffered for ``read`` again."""
        ...

    def consumed(self, size: int) -> None:
        """An attached receiver took ``size`` bytes: the peer may send that much more."""
        ...

    def reusable(self) -> bool:
        """Idle and whole: nothing unread, neither side ended or reset, and the stream's
        transport has room for more, so it may carry another request (HTTP keep-alive)."""
        ...

    async def aclose(self) -> None:
        """Release the stream (resets it if it did not end cleanly)."""
        ...

    def close(self) -> None:
        """What ``aclose`` does, from a callback (it never waits)."""
        ...


class StreamOpener(Protocol):
    """Opens streams to ``node``:``port`` at the edge."""

    async def open_stream(
        self, node: str, port: int, *, timeout_s: float, data: bytes = b""
    ) -> ByteStream:
        """Raise :class:`StreamOpenError` when it cannot. ``data``: the stream's first bytes
        (at most ``MAX_OPEN_DATA_BYTES``), sent with the open, before its answer."""
        ...
