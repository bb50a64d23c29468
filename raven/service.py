"""Running a long-lived process: start, wait for SIGINT/SIGTERM, stop gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def run_until_signalled(service: Service, name: str) -> int:
    """Start ``service``, wait for SIGINT or SIGTERM, then stop it (its drain included)."""
    await service.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s stopping", name)
    await service.stop()
    return 0
