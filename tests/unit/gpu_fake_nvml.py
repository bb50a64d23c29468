"""A fake pynvml module that behaves like the real bindings.

It reuses the real module's error classes and constants (so ``NVMLError(NVML_ERROR_GPU_IS_LOST)``
is an ``NVMLError_GpuIsLost``, exactly as the bindings raise it) and real ctypes structures where
the backend reads them (field values, GPM requests); device state lives in `FakeGpu` objects.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1 << 20


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None
    sm: int | None = None  # None: no utilisation sample (NVML reports NOT_FOUND)
    mem: int = 0
    enc: int = 0
    dec: int = 0


@dataclass
class FakeMig:
    gi: int
    name: str
    total: int
    used: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: bytes = b"00000000:18:00.0"
    minor: int = 0
    sm_clock: int = 1980
    mem_clock: int = 2619
    temp: int = 65
    mem_temp: int = 71
    power_mw: int = 312_456
    energy_mj: int = 987_654_321
    replay: int = 3
    util_gpu: int = 87
    util_mem: int = 42
    enc: int = 5
    dec: int = 9
    total: int = 81559 * MIB
    reserved: int = 530 * MIB
    used: int = 40_000 * MIB + 12345
    nvlink_tx_kib: int = 1000
    nvlink_rx_kib: int = 2345
    virt_mode: int = pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE
    rows: tuple[int, int, int, int] = (4, 1, 0, 0)
    gpm: bool = True
    gpm_values: dict[int, float] = field(
        default_factory=lambda: {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 81.5,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 42.25,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 33.0,
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 10.0,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2.5,
        }
    )
    processes: list[FakeProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    mig: list[FakeMig] = field(default_factory=list)
    memory_v2: bool = True


@dataclass(frozen=True)
class Handle:
    index: int
    mig: int | None = None


class FakeState:
    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.init_error: int | None = None
        self.driver = "550.54.15"
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.calls: list[str] = []
        self.shutdown = False
        self.gpm_live = 0


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def make_fake_nvml(gpus: list[FakeGpu]) -> tuple[types.ModuleType, FakeState]:
    st = FakeState(gpus)
    m = types.ModuleType("fake_pynvml")
    for name in dir(pynvml):
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlMemory_v")):
            setattr(m, name, getattr(pynvml, name))
    setattr(m, "c_nvmlGpmMetricsGet_t", pynvml.c_nvmlGpmMetricsGet_t)  # noqa: B010

    def dev(h: Handle, fn: str) -> FakeGpu:
        st.calls.append(fn)
        g = st.gpus[h.index]
        if g.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def api(fn: Any) -> Any:
        setattr(m, fn.__name__, fn)
        return fn

    @api
    def nvmlInit() -> None:
        if st.init_error is not None:
            raise _err(st.init_error)

    @api
    def nvmlShutdown() -> None:
        st.shutdown = True

    @api
    def nvmlSystemGetDriverVersion() -> str:
        return st.driver

    @api
    def nvmlDeviceGetCount() -> int:
        return len(st.gpus)

    @api
    def nvmlDeviceGetHandleByIndex(i: int) -> Handle:
        dev(Handle(i), "nvmlDeviceGetHandleByIndex")
        return Handle(i)

    @api
    def nvmlDeviceGetIndex(h: Handle) -> int:
        return h.index

    @api
    def nvmlDeviceGetMinorNumber(h: Handle) -> int:
        return dev(h, "nvmlDeviceGetMinorNumber").minor

    @api
    def nvmlDeviceGetUUID(h: Handle) -> str:
        return dev(h, "nvmlDeviceGetUUID").uuid

    @api
    def nvmlDeviceGetPciInfo(h: Handle) -> Any:
        return types.SimpleNamespace(busId=dev(h, "nvmlDeviceGetPciInfo").bus_id)

    @api
    def nvmlDeviceGetName(h: Handle) -> str:
        g = dev(h, "nvmlDeviceGetName")
        if h.mig is not None:
            return f"{g.name} MIG {g.mig[h.mig].name}"
        return g.name

    @api
    def nvmlDeviceGetMemoryInfo(h: Handle, version: int | None = None) -> Any:
        g = dev(h, "nvmlDeviceGetMemoryInfo")
        total, used, reserved = g.total, g.used, g.reserved
        if h.mig is not None:
            mg = g.mig[h.mig]
            total, used, reserved = mg.total, mg.used, 0
        if version:
            if not g.memory_v2:
                raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            free = total - reserved - used
            return types.SimpleNamespace(
                version=version, total=total, reserved=reserved, free=free, used=used
            )
        return types.SimpleNamespace(
            total=total, free=total - used - reserved, used=used + reserved
        )

    @api
    def nvmlDeviceGetClockInfo(h: Handle, clock: int) -> int:
        g = dev(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock if clock == pynvml.NVML_CLOCK_SM else g.mem_clock

    @api
    def nvmlDeviceGetTemperature(h: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return dev(h, "nvmlDeviceGetTemperature").temp

    @api
    def nvmlDeviceGetFieldValues(h: Handle, ids: list[Any]) -> Any:
        g = dev(h, "nvmlDeviceGetFieldValues")
        arr = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, requested in enumerate(ids):
            fid = requested[0] if isinstance(requested, tuple) else requested
            arr[i].fieldId = fid
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                if "memory_temp" in g.unsupported:
                    arr[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                    continue
                arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                arr[i].value.uiVal = g.mem_temp
            elif fid in (
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
            ):
                if "nvlink" in g.unsupported:
                    arr[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                    continue
                arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                tx = fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX
                arr[i].value.ullVal = g.nvlink_tx_kib if tx else g.nvlink_rx_kib
            else:
                arr[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return arr

    @api
    def nvmlDeviceGetPowerUsage(h: Handle) -> int:
        return dev(h, "nvmlDeviceGetPowerUsage").power_mw

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h: Handle) -> int:
        return dev(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    @api
    def nvmlDeviceGetPcieReplayCounter(h: Handle) -> int:
        return dev(h, "nvmlDeviceGetPcieReplayCounter").replay

    @api
    def nvmlDeviceGetUtilizationRates(h: Handle) -> Any:
        g = dev(h, "nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    @api
    def nvmlDeviceGetEncoderUtilization(h: Handle) -> list[int]:
        return [dev(h, "nvmlDeviceGetEncoderUtilization").enc, 167000]

    @api
    def nvmlDeviceGetDecoderUtilization(h: Handle) -> list[int]:
        return [dev(h, "nvmlDeviceGetDecoderUtilization").dec, 167000]

    @api
    def nvmlDeviceGetRemappedRows(h: Handle) -> tuple[int, int, int, int]:
        return dev(h, "nvmlDeviceGetRemappedRows").rows

    @api
    def nvmlDeviceGetVirtualizationMode(h: Handle) -> int:
        return dev(h, "nvmlDeviceGetVirtualizationMode").virt_mode

    @api
    def nvmlDeviceGetGridLicensableFeatures(h: Handle) -> Any:
        dev(h, "nvmlDeviceGetGridLicensableFeatures")
        feature = types.SimpleNamespace(featureState=1)
        return types.SimpleNamespace(
            isGridLicenseSupported=1, licensableFeaturesCount=1, gridLicensableFeatures=[feature]
        )

    @api
    def nvmlGpmQueryDeviceSupport(h: Handle) -> Any:
        g = dev(h, "nvmlGpmQueryDeviceSupport")
        return types.SimpleNamespace(version=1, isSupportedDevice=1 if g.gpm else 0)

    @api
    def nvmlGpmSampleAlloc() -> Any:
        st.gpm_live += 1
        return pynvml.c_nvmlGpmSample_t()

    @api
    def nvmlGpmSampleGet(h: Handle, sample: Any) -> Any:
        dev(h, "nvmlGpmSampleGet")
        return sample

    @api
    def nvmlGpmSampleFree(sample: Any) -> None:
        st.gpm_live -= 1

    @api
    def nvmlGpmMetricsGet(req: Any) -> Any:
        assert req.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        g = st.gpus[0]
        for i in range(req.numMetrics):
            metric = req.metrics[i]
            if metric.metricId in g.gpm_values:
                metric.value = g.gpm_values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return req

    def procs_of(h: Handle, fn: str) -> list[FakeProcess]:
        g = dev(h, fn)
        return g.mig[h.mig].processes if h.mig is not None else g.processes

    @api
    def nvmlDeviceGetComputeRunningProcesses(h: Handle) -> list[Any]:
        return [
            types.SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes)
            for p in procs_of(h, "nvmlDeviceGetComputeRunningProcesses")
        ]

    @api
    def nvmlDeviceGetProcessUtilization(h: Handle, ts: int) -> list[Any]:
        samples = [
            types.SimpleNamespace(
                pid=p.pid,
                timeStamp=ts + 1000,
                smUtil=p.sm,
                memUtil=p.mem,
                encUtil=p.enc,
                decUtil=p.dec,
            )
            for p in procs_of(h, "nvmlDeviceGetProcessUtilization")
            if p.sm is not None
        ]
        if not samples:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    @api
    def nvmlDeviceGetMigMode(h: Handle) -> list[int]:
        g = dev(h, "nvmlDeviceGetMigMode")
        on = 1 if g.mig else 0
        return [on, on]

    @api
    def nvmlDeviceGetMaxMigDeviceCount(h: Handle) -> int:
        return 7 if dev(h, "nvmlDeviceGetMaxMigDeviceCount").mig else 0

    @api
    def nvmlDeviceGetMigDeviceHandleByIndex(h: Handle, i: int) -> Handle:
        g = dev(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if i >= len(g.mig):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(h.index, i)

    @api
    def nvmlDeviceGetGpuInstanceId(h: Handle) -> int:
        g = dev(h, "nvmlDeviceGetGpuInstanceId")
        assert h.mig is not None
        return g.mig[h.mig].gi

    @api
    def nvmlEventSetCreate() -> str:
        return "event-set"

    @api
    def nvmlDeviceRegisterEvents(h: Handle, types_: int, es: str) -> None:
        dev(h, "nvmlDeviceRegisterEvents")

    @api
    def nvmlEventSetWait(es: str, timeout_ms: int) -> Any:
        if not st.events:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = st.events.pop(0)
        return types.SimpleNamespace(
            device=Handle(index),
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0,
            computeInstanceId=0,
        )

    @api
    def nvmlEventSetFree(es: str) -> None:
        return None

    return m, st
