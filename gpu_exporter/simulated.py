"""A simulated GPU backend: N GPUs of a chosen model, driven by a load profile.

Every value is a pure function of (seed, model, profile, GPU index, time): the same inputs give
the same snapshot, so tests can compute what a scrape must show. Counters that integrate over
time (energy, NVLink traffic) are computed in closed form from a fixed boot time, so they only
grow and never depend on when the exporter started.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpu_exporter.backend import (
    GpuFailure,
    GpuInfo,
    GpuSample,
    PodRef,
    ProcessSample,
    Snapshot,
)

__all__ = [
    "BOOT_TIME_S",
    "LOAD_PROFILES",
    "MODELS",
    "GpuModel",
    "SimulatedBackend",
    "resolve_model",
    "utilisation",
]

BOOT_TIME_S = 1_700_000_000.0
"""Simulated boot time (Unix seconds): energy and NVLink counters integrate from here."""

DRIVER_VERSION = "550.54.15"


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str
    memory_total_mib: int
    memory_reserved_mib: int
    idle_power_w: float
    max_power_w: float
    idle_sm_clock_mhz: int
    max_sm_clock_mhz: int
    mem_clock_mhz: int
    gpm: bool
    """NVML GPM (profiling metrics) works: Hopper and newer."""
    nvlink: bool


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            "H100", "NVIDIA H100 80GB HBM3", 81559, 530, 70.0, 700.0, 345, 1980, 2619, True, True
        ),
        GpuModel("H200", "NVIDIA H200", 143771, 612, 75.0, 700.0, 345, 1980, 3201, True, True),
        GpuModel(
            "A100", "NVIDIA A100-SXM4-80GB", 81920, 619, 60.0, 400.0, 210, 1410, 1593, False, True
        ),
        GpuModel("L4", "NVIDIA L4", 23034, 418, 16.0, 72.0, 210, 2040, 6251, False, False),
        GpuModel("T4", "Tesla T4", 15360, 255, 10.0, 70.0, 300, 1590, 5000, False, False),
    )
}


def resolve_model(name: str) -> GpuModel:
    """A model by key (``H100``) or by its NVML name (``NVIDIA H100 80GB HBM3``), any case."""
    wanted = name.strip().lower()
    for m in MODELS.values():
        if wanted in (m.key.lower(), m.name.lower()):
            return m
    raise ValueError(f"unknown GPU model {name!r} (choose from {', '.join(MODELS)})")


LOAD_PROFILES = ("idle", "training", "inference", "bursty", "mixed")
_MIXED_CYCLE = ("training", "inference", "bursty", "idle")

_BURST_PERIOD_S = 30.0
_BURST_DUTY = 0.3
_BURST_HIGH = 0.95
_BURST_LOW = 0.05


def _rng(key: str) -> random.Random:
    """A generator seeded from a string: deterministic across runs (simulation, not crypto)."""
    return random.Random(key)


def _phase(seed: int, index: int) -> float:
    return _rng(f"raven-sim:{seed}:{index}").uniform(0.0, 2.0 * math.pi)


def _profile_for(profile: str, index: int) -> str:
    return _MIXED_CYCLE[index % len(_MIXED_CYCLE)] if profile == "mixed" else profile


def utilisation(profile: str, phase: float, t: float) -> float:
    """GPU utilisation (0..1) of a profile at time t (seconds)."""
    if profile == "idle":
        return 0.0
    if profile == "training":
        return 0.9 + 0.06 * math.sin(2.0 * math.pi * t / 60.0 + phase)
    if profile == "inference":
        return 0.45 + 0.3 * math.sin(2.0 * math.pi * t / 300.0 + phase)
    if profile == "bursty":
        r = (t + phase / (2.0 * math.pi) * _BURST_PERIOD_S) % _BURST_PERIOD_S
        return _BURST_HIGH if r < _BURST_DUTY * _BURST_PERIOD_S else _BURST_LOW
    raise ValueError(f"unknown load profile {profile!r}")


def _utilisation_integral(profile: str, phase: float, t: float) -> float:
    """An antiderivative of `utilisation` in t (closed form, so counters are pure functions)."""
    if profile == "idle":
        return 0.0
    if profile in ("training", "inference"):
        mean, amp, period = (0.9, 0.06, 60.0) if profile == "training" else (0.45, 0.3, 300.0)
        w = 2.0 * math.pi / period
        return mean * t - amp * math.cos(w * t + phase) / w
    s = t + phase / (2.0 * math.pi) * _BURST_PERIOD_S
    n = math.floor(s / _BURST_PERIOD_S)
    r = s - n * _BURST_PERIOD_S
    on = _BURST_DUTY * _BURST_PERIOD_S
    per_period = _BURST_HIGH * on + _BURST_LOW * (_BURST_PERIOD_S - on)
    return n * per_period + _BURST_HIGH * min(r, on) + _BURST_LOW * max(0.0, r - on)


@dataclass(frozen=True, slots=True)
class _ProcPlan:
    pid: int
    memory_fraction: float
    share: float
    pod: PodRef


def _process_plan(seed: int, index: int, profile: str) -> list[_ProcPlan]:
    rng = _rng(f"raven-sim-proc:{seed}:{index}")
    if profile == "idle":
        return []
    if profile == "training":
        layout = [("ml", f"train-{seed}-{index}", "trainer", 0.85, 1.0)]
    elif profile == "inference":
        layout = [
            ("serving", f"infer-{seed}-{index}-{k}", "server", 0.2, s)
            for k, s in enumerate((0.5, 0.3, 0.2))
        ]
    else:
        layout = [("batch", f"burst-{seed}-{index}", "worker", 0.5, 1.0)]
    plans = []
    for namespace, pod, container, mem, share in layout:
        pid = rng.randrange(1000, 4_000_000)
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"raven-sim/{namespace}/{pod}"))
        plans.append(_ProcPlan(pid, mem, share, PodRef(namespace, pod, container, uid)))
    return plans


class SimulatedBackend:
    """N simulated GPUs; `collect` is a pure function of (configuration, now)."""

    def __init__(
        self,
        count: int,
        *,
        model: str = "H100",
        seed: int = 0,
        load_profile: str = "training",
        failing: Iterable[int] = (),
        clock: Callable[[], float] | None = None,
    ) -> None:
        if count < 0 or count > 64:
            raise ValueError("simulated GPU count must be between 0 and 64")
        if load_profile not in LOAD_PROFILES:
            raise ValueError(
                f"unknown load profile {load_profile!r} (choose from {', '.join(LOAD_PROFILES)})"
            )
        self.count = count
        self.model = resolve_model(model)
        self.seed = seed
        self.load_profile = load_profile
        self.failing = frozenset(failing)
        self._clock = clock

    @property
    def name(self) -> str:
        return f"simulated({self.count}x{self.model.key},{self.load_profile},seed={self.seed})"

    def gpu_info(self, index: int) -> GpuInfo:
        m = self.model
        rng = _rng(f"raven-sim-id:{self.seed}:{index}")
        gpu_uuid = "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))
        bus = 0x18 + index * 0x10 if index < 14 else index
        return GpuInfo(
            index=index,
            uuid=gpu_uuid,
            pci_bus_id=f"00000000:{bus:02X}:00.0",
            device=f"nvidia{index}",
            model_name=m.name,
            memory_total_mib=m.memory_total_mib,
        )

    def sample(self, index: int, fields: frozenset[str], now: float) -> GpuSample:
        """The state of one GPU at time `now` (seconds)."""
        m = self.model
        profile = _profile_for(self.load_profile, index)
        phase = _phase(self.seed, index)
        u = utilisation(profile, phase, now)
        active = u > 0.1
        plans = _process_plan(self.seed, index, profile)
        usable = m.memory_total_mib - m.memory_reserved_mib
        procs = tuple(
            ProcessSample(
                pid=p.pid,
                used_memory_mib=int(usable * p.memory_fraction),
                sm_util=round(100.0 * u * p.share),
                mem_util=round(55.0 * u * p.share),
                enc_util=0,
                dec_util=round(10.0 * u * p.share) if profile == "inference" else 0,
                pod=p.pod,
            )
            for p in plans
        )
        used = sum(p.used_memory_mib for p in procs)
        elapsed_u = _utilisation_integral(profile, phase, now) - _utilisation_integral(
            profile, phase, BOOT_TIME_S
        )
        span = m.max_power_w - m.idle_power_w
        energy_j = m.idle_power_w * (now - BOOT_TIME_S) + span * 0.9 * elapsed_u
        gpu_temp = round(32 + 48 * u)
        values: dict[str, float] = {
            "DCGM_FI_DEV_SM_CLOCK": m.max_sm_clock_mhz if active else m.idle_sm_clock_mhz,
            "DCGM_FI_DEV_MEM_CLOCK": m.mem_clock_mhz,
            "DCGM_FI_DEV_GPU_TEMP": gpu_temp,
            "DCGM_FI_DEV_MEMORY_TEMP": gpu_temp + 4,
            "DCGM_FI_DEV_POWER_USAGE": round(m.idle_power_w + span * 0.9 * u, 3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(energy_j * 1000.0),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": round(100.0 * u),
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(55.0 * u),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": sum(p.dec_util for p in procs),
            "DCGM_FI_DEV_XID_ERRORS": 0,
            "DCGM_FI_DEV_FB_FREE": usable - used,
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_RESERVED": m.memory_reserved_mib,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        }
        if m.nvlink:
            values["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = int(elapsed_u * 2_000_000)
        if m.gpm:
            values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = round(u, 6)
            values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] = round(
                u * (0.6 if profile == "training" else 0.25), 6
            )
            values["DCGM_FI_PROF_DRAM_ACTIVE"] = round(u * 0.5, 6)
            values["DCGM_FI_PROF_PCIE_TX_BYTES"] = int(u * 1.5e9)
            values["DCGM_FI_PROF_PCIE_RX_BYTES"] = int(u * 3.0e9)
        wanted = {k: v for k, v in values.items() if k in fields}
        pod = procs[0].pod if procs else None
        return GpuSample(self.gpu_info(index), wanted, procs, pod)

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        if self._clock is not None:
            now = self._clock()
        gpus = []
        failures = []
        for i in range(self.count):
            if i in self.failing:
                failures.append(GpuFailure(self.gpu_info(i), "GPU is lost (simulated)"))
            else:
                gpus.append(self.sample(i, fields, now))
        return Snapshot(now, DRIVER_VERSION, tuple(gpus), tuple(failures))

    def close(self) -> None:
        return None
