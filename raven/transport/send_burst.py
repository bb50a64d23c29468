"""SendBurst: tunnels flush their datagrams once at the end of a TUN read batch.

A datagram sent while nothing else is pending is flushed in the same loop turn (sealed and
written at once: no ``call_soon`` round, the latency of a ping). When many come together,
as when a TUN device reads a batch of packets in one wake-up, they should share records
and one write instead: the reader wraps its batch in ``with SEND_BURST:``, and a tunnel
whose :meth:`SendBurst.defer` returns True flushes when the batch ends (once, however many
packets it took). Outside a batch ``defer`` returns False and the tunnel flushes at once.

One per process (``SEND_BURST``): the TUN readers and the tunnels meet on one event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["SEND_BURST", "SendBurst"]

log = logging.getLogger(__name__)


class SendBurst:
    """Flushes deferred while a read batch is running (see the module docstring)."""

    __slots__ = ("_pending", "depth")

    def __init__(self) -> None:
        #: batches running (nested ``with``); read it, the context manager changes it
        self.depth = 0
        self._pending: list[Callable[[], None]] = []

    def defer(self, flush: Callable[[], None]) -> bool:
        """Run ``flush`` at the end of the running batch; False (not taken) outside one.
        The caller defers once per batch (it remembers that a flush is coming)."""
        if not self.depth:
            return False
        self._pending.append(flush)
        return True

    def __enter__(self) -> SendBurst:
        self.depth += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if self.depth:
            return
        while self._pending:
            pending, self._pending = self._pending, []
            for flush in pending:
                try:
                    flush()
                except Exception:  # one tunnel's failure must not strand the others
                    log.exception("deferred tunnel flush failed")


#: The process's burst (TUN readers enter it, tunnels defer to it).
SEND_BURST = SendBurst()
