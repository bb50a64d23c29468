"""Where the rendered text goes: a file (atomic replace) or a ConfigMap.

Sinks are blocking (file system, Kubernetes API); the generator runs them in a thread.
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    #: Short label for metrics and logs ("file", "configmap").
    name: str

    def write(self, text: str) -> bool:
        """Store ``text``; False when the sink already held exactly this text.

        Raises SinkError when it cannot; the previous content is then left in place.
        """
