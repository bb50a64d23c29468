"""Run the GPU exporter inside the edge agent (config section ``gpu_exporter``)."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from gpu_exporter.backend import GpuBackend
from gpu_exporter.cli import parse_address
from gpu_exporter.counters import default_counters
from gpu_exporter.exposition import ExpositionOptions
from gpu_exporter.server import GpuExporter
from gpu_exporter.simulated import SimulatedBackend

__all__ = ["EmbeddedExporterConfig", "start_embedded_exporter"]

DEFAULT_INTERVAL_S = 30.0


class EmbeddedExporterConfig(Protocol):
    """What the agent's configuration provides (raven.config.agent.GpuExporterConfig)."""

    @property
    def listen(self) -> str: ...
    @property
    def simulate(self) -> int: ...
    @property
    def model(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def hostname(self) -> str | None: ...


def _backend(config: EmbeddedExporterConfig) -> GpuBackend:
    if config.simulate > 0:
        return SimulatedBackend(config.simulate, model=config.model, seed=config.seed)
    from gpu_exporter.nvml_backend import NvmlBackend

    return NvmlBackend()


async def start_embedded_exporter(
    config: EmbeddedExporterConfig, *, interval_s: float = DEFAULT_INTERVAL_S
) -> GpuExporter:
    """Build, start and return the exporter; `await exporter.stop()` ends it.

    Raises BackendUnavailableError (no NVML; the message names the fix), ValueError (bad
    listen address or model) or OSError (cannot listen).
    """
    host, port = parse_address(config.listen)
    hostname = config.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    backend = _backend(config)
    exporter = GpuExporter(
        backend,
        counters=default_counters(),
        options=ExpositionOptions(hostname=hostname, node_name=hostname),
        interval_s=interval_s,
        host=host,
        port=port,
        close_backend=True,
    )
    try:
        await exporter.start()
    except BaseException:
        backend.close()
        raise
    return exporter
