"""Run the GPU exporter inside the edge agent (config section ``gpu_exporter``)."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from edge_agent.gpu.backend import GpuBackend
from edge_agent.gpu.cli import parse_address
from edge_agent.gpu.counters import default_counters
from edge_agent.gpu.exposition import ExpositionOptions
from edge_agent.gpu.server import GpuExporter
from edge_agent.gpu.simulated import SimulatedBackend

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
    from edge_agent.gpu.nvml_backend import NvmlBackend

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
