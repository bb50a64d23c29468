"""dcgm-exporter compatible GPU metrics: NVML or simulated backends, per-process and per-pod.

Run standalone with ``raven gpu-exporter`` or embed `GpuExporter` in the edge agent::

    exporter = GpuExporter(SimulatedBackend(2), counters=default_counters(),
                           options=ExpositionOptions(hostname="edge-gpu-1"), port=9400)
    await exporter.start()
    ...
    await exporter.stop()
"""

from gpu_exporter.backend import (
    BackendUnavailableError,
    GpuBackend,
    GpuFailure,
    GpuInfo,
    GpuSample,
    PodRef,
    ProcessSample,
    Snapshot,
)
from gpu_exporter.counters import Counter, CountersFileError, default_counters, parse_counters
from gpu_exporter.exposition import ExpositionOptions, render
from gpu_exporter.server import GpuExporter
from gpu_exporter.simulated import SimulatedBackend

__all__ = [
    "BackendUnavailableError",
    "Counter",
    "CountersFileError",
    "ExpositionOptions",
    "GpuBackend",
    "GpuExporter",
    "GpuFailure",
    "GpuInfo",
    "GpuSample",
    "PodRef",
    "ProcessSample",
    "SimulatedBackend",
    "Snapshot",
    "default_counters",
    "parse_counters",
    "render",
]
