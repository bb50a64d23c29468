"""GPU models the simulator knows, and their MIG layouts.

The H100 row was checked against a real H100 80GB HBM3 (driver 580.159.04; the table in
docs/gpu-exporter.md): idle SM clock 345 MHz, memory clock 2619 MHz, 480 MiB reserved, about
76 W and 50 C (memory 57 C) idle, 700 W (its cap) and about 70 C under a bf16 matrix-product
load, where the SM clock settles near 1425 MHz under the power cap. The other rows use the
models' data-sheet figures.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODELS", "GpuModel", "MigSlice", "resolve_model"]


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG GPU instance of a layout: profile, GPU-instance id, memory."""

    profile: str
    gpu_instance: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str
    memory_total_mib: int
    memory_reserved_mib: int
    idle_power_w: float
    max_power_w: float
    idle_sm_clock_mhz: int
    load_sm_clock_mhz: int
    """SM clock under a full load (the power cap holds it below the boost clock)."""
    mem_clock_mhz: int
    idle_temp_c: int
    load_temp_c: int
    nvlink: bool
    mig: tuple[MigSlice, ...] = ()
    """The layout a MIG-enabled GPU of this model is cut into; empty: no MIG."""


_H100_MIG = (
    MigSlice("3g.40gb", 2, 40192),
    MigSlice("2g.20gb", 5, 19968),
    MigSlice("1g.10gb", 13, 9856),
)
_A100_MIG = (
    MigSlice("3g.40gb", 2, 40192),
    MigSlice("2g.20gb", 5, 19968),
    MigSlice("1g.10gb", 13, 9728),
)
_H200_MIG = (
    MigSlice("3g.71gb", 2, 71424),
    MigSlice("2g.35gb", 5, 35584),
    MigSlice("1g.18gb", 13, 16896),
)

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            "H100",
            "NVIDIA H100 80GB HBM3",
            81559,
            480,
            76.0,
            700.0,
            345,
            1425,
            2619,
            50,
            70,
            True,
            _H100_MIG,
        ),
        GpuModel(
            "H200",
            "NVIDIA H200",
            143771,
            612,
            75.0,
            700.0,
            345,
            1500,
            3201,
            35,
            72,
            True,
            _H200_MIG,
        ),
        GpuModel(
            "A100",
            "NVIDIA A100-SXM4-80GB",
            81920,
            619,
            60.0,
            400.0,
            210,
            1410,
            1593,
            33,
            68,
            True,
            _A100_MIG,
        ),
        GpuModel("L4", "NVIDIA L4", 23034, 418, 16.0, 72.0, 210, 2040, 6251, 35, 74, False),
        GpuModel("T4", "Tesla T4", 15360, 255, 10.0, 70.0, 300, 1590, 5000, 33, 72, False),
        GpuModel(
            "V100", "Tesla V100-SXM2-32GB", 32768, 336, 40.0, 300.0, 135, 1530, 877, 32, 70, True
        ),
    )
}


def resolve_model(name: str) -> GpuModel:
    """A model by key (``H100``) or by its NVML name (``NVIDIA H100 80GB HBM3``), any case."""
    wanted = name.strip().lower()
    for m in MODELS.values():
        if wanted in (m.key.lower(), m.name.lower()):
            return m
    raise ValueError(f"unknown GPU model {name!r} (choose from {', '.join(MODELS)})")
