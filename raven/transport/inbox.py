"""The one awaitable reader of a stream, built on its push interface.

Streams deliver by callbacks only (:class:`~raven.transport.stream.StreamReceiver`). A stream
with no receiver attached delivers to its :class:`StreamInbox`, which holds the chunks as they
came (no copies) for ``await read()`` (the backfill's message streams, tests) and hands them to
a receiver attached later (bytes that arrived before the relay was attached). The stream keeps
its own state (ended, reset): the inbox asks it (:class:`InboxOwner`), so a read after a
detach sees what happened while a receiver was attached.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from raven.transport.stream import StreamReceiver, StreamResetError

__all__ = ["InboxOwner", "StreamInbox"]


class InboxOwner(Protocol):
    """The stream an inbox belongs to."""

    @property
    def receiver(self) -> StreamReceiver:
        """Where the stream delivers now (its inbox while none is attached)."""
        ...

    def read_failure(self) -> StreamResetError | None:
        """What a read raises once the chunks are taken (the stream was reset)."""
        ...

    def read_ended(self) -> bool:
        """No more bytes will come (the peer ended, or the stream closed)."""
        ...

    def consumed(self, size: int) -> None:
        """``size`` bytes were read: their credit may flow back."""
        ...


class StreamInbox:
    """A stream's received bytes held for ``read`` (a StreamReceiver; see the module)."""

    __slots__ = ("_owner", "_waiter", "chunks")

    def __init__(self, owner: InboxOwner) -> None:
        self._owner = owner
        self.chunks: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        """Chunks held."""
        return len(self.chunks)

    # ------------------------------------------------------------ StreamReceiver
    def stream_data(self, data: bytes) -> None:
        self.chunks.append(data)
        self.wake()

    def stream_eof(self) -> None:
        self.wake()

    def stream_reset(self, error: StreamResetError) -> None:
        self.wake()

    def stream_writable(self) -> None:
        """Nothing to do: writers wait on the stream."""

    # ------------------------------------------------------------ the stream's calls
    def wake(self) -> None:
        """The stream's state changed (or bytes came): a waiting read looks again."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def hand_to(self, receiver: StreamReceiver) -> None:
        """Deliver the held chunks to a newly attached ``receiver``, in order, while it stays
        attached (it may detach from a callback)."""
        owner, chunks = self._owner, self.chunks
        while chunks and owner.receiver is receiver:
            receiver.stream_data(chunks.popleft())

    def drop(self) -> int:
        """Let go of what is held (nobody will read it); how many bytes that was."""
        size = sum(map(len, self.chunks))
        self.chunks.clear()
        return size

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes``, as they came; b"" once the stream ended; raises the stream's
        reset once the bytes before it were read."""
        owner, chunks = self._owner, self.chunks
        while not chunks:
            failure = owner.read_failure()
            if failure is not None:
                raise failure
            if owner.read_ended():
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        chunk = chunks.popleft()
        if len(chunk) > max_bytes:
            chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        owner.consumed(len(chunk))
        return chunk
