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
from gpu_exporter.setup import build_mapper
from gpu_exporter.simulated import SimulatedBackend

__all__ = ["EmbeddedExporterConfig", "start_embedded_exporter"]


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
    @property
    def sharing(self) -> str: ...
    @property
    def interval_s(self) -> float: ...
    @property
    def kubernetes(self) -> bool: ...
    @property
    def pod_resources_socket(self) -> str: ...
    @property
    def label_mode(self) -> str: ...
    @property
    def per_process(self) -> bool: ...


def _backend(config: EmbeddedExporterConfig) -> GpuBackend:
    if config.simulate > 0:
        return SimulatedBackend(
            config.simulate, model=config.model, seed=config.seed, sharing=config.sharing
        )
    from gpu_exporter.setup import real_backend

    return real_backend(processes=True, interval_s=config.interval_s)


async def start_embedded_exporter(
    config: EmbeddedExporterConfig, *, interval_s: float | None = None
) -> GpuExporter:
    """Build, start and return the exporter; `await exporter.stop()` ends it. The same
    `GpuExporter`, pod mapping included, as ``raven gpu-exporter``.

    Raises BackendUnavailableError (no NVML; the message names the fix), ValueError (bad
    listen address, model or label mode) or OSError (cannot listen).
    """
    host, port = parse_address(config.listen)
    hostname = config.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    options = ExpositionOptions(
        hostname=hostname,
        node_name=hostname,
        kubernetes=config.kubernetes,
        label_mode=config.label_mode,
        per_process=config.per_process,
    )
    mapper = None
    if config.kubernetes and config.simulate <= 0:
        mapper = build_mapper(config.pod_resources_socket, node_name=hostname)
    backend = _backend(config)
    exporter = GpuExporter(
        backend,
        counters=default_counters(),
        options=options,
        interval_s=interval_s or config.interval_s,
        host=host,
        port=port,
        mapper=mapper,
        close_backend=True,
    )
    try:
        await exporter.start()
    except BaseException:
        backend.close()
        raise
    return exporter
