"""Where the names come from: Kubernetes Nodes, a gateway's live registry, a static YAML list.

Every source has the same small shape (:class:`Source`): ``load()`` for one-shot use,
``run(on_change)`` for the long-running mode and ``snapshot()`` for the current view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from coredns_hosts.model import Snapshot

#: Called (on the event loop's thread) whenever ``snapshot()`` may have changed.
OnChange = Callable[[], None]


class Source(Protocol):
    #: Stable description, written into the generated header.
    origin: str

    async def load(self) -> Snapshot:
        """Read the inputs once and return a snapshot (``--once`` and ``check``)."""

    async def run(self, on_change: OnChange) -> None:
        """Follow the inputs until cancelled, calling ``on_change`` after each change."""

    def snapshot(self) -> Snapshot:
        """The current view; SourceNotReady while it cannot be rendered."""
