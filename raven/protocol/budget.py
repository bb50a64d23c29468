"""The peer's control budget: how much control work (frames and bytes per second) a peer
may cause on one tunnel before the tunnel is closed.

Data frames (DATA, DATAGRAM) and CREDIT (which follows data) are free; every other frame counts
one, and every entry of a REGISTER / REGISTER_RESULT counts one too (each entry is validated).
Both budgets are token buckets that hold ``Limits.control_burst_s`` seconds' worth.
"""

from __future__ import annotations

from raven.protocol.constants import FRAME_HEADER_BYTES
from raven.protocol.frames import (
    CreditFrame,
    DataFrame,
    DatagramFrame,
    Frame,
    OpenFrame,
    RegisterFrame,
    RegisterResultFrame,
)
from raven.protocol.limits import Limits
from raven.protocol.ratelimit import Budget

#: Wire size of a CREDIT frame (not charged: it follows data).
_CREDIT_FRAME_BYTES = FRAME_HEADER_BYTES + 4


class ControlBudget:
    """Charges each received payload's control work; see the module docstring."""

    __slots__ = ("_bytes", "_frames", "_limits")

    def __init__(self, limits: Limits, now: float) -> None:
        self._limits = limits
        burst = limits.control_burst_s
        rate = limits.max_control_frames_per_s
        self._frames = Budget(rate_per_s=rate, capacity=rate * burst, now=now)
        rate = limits.max_control_bytes_per_s
        self._bytes = Budget(rate_per_s=rate, capacity=rate * burst, now=now)

    def charge(self, frames: list[Frame], size: int, now: float) -> str | None:
        """Charge one payload of ``size`` bytes; None within budget, else why not."""
        ops = 0
        free = 0
        for frame in frames:
            if isinstance(frame, DataFrame | DatagramFrame):
                free += FRAME_HEADER_BYTES + len(frame.data)
            elif isinstance(frame, CreditFrame):
                free += _CREDIT_FRAME_BYTES
            elif isinstance(frame, OpenFrame):  # its data is stream data (credited), not control
                ops += 1
                free += len(frame.data)
            elif isinstance(frame, RegisterFrame):
                ops += 1 + len(frame.nodes) + len(frame.prefixes)
            elif isinstance(frame, RegisterResultFrame):
                ops += 1 + len(frame.accepted_nodes) + len(frame.accepted_prefixes)
                ops += len(frame.refused)
            else:
                ops += 1
        if not ops:
            return None
        if not self._frames.spend(ops, now):
            return f"control budget exceeded ({self._limits.max_control_frames_per_s:g} frames/s)"
        if not self._bytes.spend(size - free, now):
            return f"control budget exceeded ({self._limits.max_control_bytes_per_s:g} bytes/s)"
        return None
