"""Where the rendered text goes: a file (atomic replace) or a ConfigMap.

Sinks are awaited on the generator's event loop: the file sink does its blocking file system
work in a worker thread, the ConfigMap sink talks to the API server through raven.kube's
client (the one Kubernetes client of every component).
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    #: Short label for metrics and logs ("file", "configmap").
    name: str

    async def write(self, text: str) -> bool:
        """Store ``text``; False when the sink already held exactly this text.

        Raises SinkError when it cannot; the previous content is then left in place.
        """

    async def close(self) -> None:
        """Let go of what the sink holds (connections)."""
