"""State shared by every proxy connection: opener, configuration, metrics, drain flag."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field

from cloud_gateway.proxy.errors import ProxyError
from cloud_gateway.proxy.metrics import ProxyMetrics
from raven.config.gateway import ProxyConfig
from raven.logs import fields
from raven.transport.stream import StreamOpener

log = logging.getLogger("cloud_gateway.proxy")

#: Read size from clients.
READ_BYTES = 65536
#: Read size from targets (response bodies): fewer loop turns per scrape page.
BODY_READ_BYTES = 262144
#: Largest response head accepted from a target.
MAX_RESPONSE_HEAD_BYTES = 65536
#: Longest scrape timeout honoured from X-Prometheus-Scrape-Timeout-Seconds.
MAX_SCRAPE_TIMEOUT_S = 3600.0
#: Mode label for requests rejected before their target was known.
UNKNOWN_MODE = "unknown"


@dataclass
class ProxyContext:
    """What connection handlers share."""

    opener: StreamOpener
    config: ProxyConfig
    metrics: ProxyMetrics
    draining: bool = False
    idle: set[asyncio.StreamWriter] = field(default_factory=set)

    def scrape_timeout(self, header: bytes | None) -> float:
        """The tunnel-leg bound for a request: the Prometheus header, else the default."""
        if header is not None:
            try:
                value = float(header)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and value > 0:
                return min(value, MAX_SCRAPE_TIMEOUT_S)
        return self.config.default_timeout_s

    def record_error(
        self, exc: ProxyError, mode: str, peer: str, node: str = "", code: int | None = None
    ) -> None:
        """Count a failure and log it in one line (client faults at INFO, others at WARNING)."""
        kind = exc.kind
        self.metrics.error(kind)
        self.metrics.request(mode, kind.status if code is None else code)
        level = logging.INFO if kind.client_fault else logging.WARNING
        log.log(
            level,
            "proxy error",
            extra=fields(reason=kind.value, status=kind.status, mode=mode, node=node or None,
                         peer=peer, detail=exc.detail or None),
        )  # fmt: skip


def peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "?"
