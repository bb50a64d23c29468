"""Debounce change notifications into few writes (pure; time is an argument).

A write happens once the inputs have been quiet for ``quiet_s``, and at the latest
``max_delay_s`` after the first change of a burst, so a steady trickle of changes cannot
postpone the write forever. 10,000 nodes registering within a second give one write.
"""

from __future__ import annotations


class Debouncer:
    def __init__(self, *, quiet_s: float, max_delay_s: float) -> None:
        if quiet_s < 0 or max_delay_s < quiet_s:
            raise ValueError("need 0 <= quiet_s <= max_delay_s")
        self.quiet_s = quiet_s
        self.max_delay_s = max_delay_s
        self._first: float | None = None
        self._last: float | None = None

    @property
    def pending(self) -> bool:
        return self._first is not None

    def changed(self, now: float) -> None:
        """Record one change notification."""
        if self._first is None:
            self._first = now
        self._last = now

    def deadline(self) -> float | None:
        """When the pending burst should be written; None when nothing is pending."""
        if self._first is None or self._last is None:
            return None
        return min(self._last + self.quiet_s, self._first + self.max_delay_s)

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def fired(self) -> None:
        """The pending burst was taken for writing; later changes start a new burst."""
        self._first = None
        self._last = None
