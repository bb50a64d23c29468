"""EventQueue: a FIFO of protocol events that holds no memory while empty.

A connection's events are produced and consumed within one ``receive_data`` or call, so the
queue is empty nearly always; an empty ``collections.deque`` still costs ~760 bytes, which a
gateway pays once per idle tunnel. This queue makes its deque on the first event and drops
it when the last one is taken.
"""

from __future__ import annotations

from collections import deque

from raven.protocol.events import Event


class EventQueue:
    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: deque[Event] | None = None

    def append(self, event: Event) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append(event)

    def popleft(self) -> Event | None:
        """The oldest event, or None when there is none."""
        items = self._items
        if not items:
            return None
        event = items.popleft()
        if not items:
            self._items = None
        return event

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items) if self._items else 0
