"""A fake pynvml module that behaves like the real bindings.

`FakeNvml` is a module object whose methods are the NVML calls the backend makes, grouped as the
NVML API documentation groups them. It reuses the real module's error classes and constants (so
``NVMLError(NVML_ERROR_GPU_IS_LOST)`` is an ``NVMLError_GpuIsLost``, exactly as the bindings raise
it) and real ctypes structures where the backend reads them (field values, GPM requests). Device
state lives in `FakeGpu` / `FakeMig` objects; a test changes them between collections.
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
    uuid: str = ""


@dataclass
class FakeGpu:
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: bytes = b"00000000:18:00.0"
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
            pynvml.NVML_GPM_METRIC_SM_UTIL: 90.0,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 40.0,
            pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.0,
            pynvml.NVML_GPM_METRIC_FP32_UTIL: 12.0,
            pynvml.NVML_GPM_METRIC_FP16_UTIL: 6.0,
        }
    )
    pcie_tx_kbs: int = 1200
    pcie_rx_kbs: int = 3400
    violation_ns: int = 7_000_000
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 2,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 11,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 1,
        }
    )
    retired_sbe: int = 2
    retired_dbe: int = 1
    retired_pending: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    mig: list[FakeMig] = field(default_factory=list)
    memory_v2: bool = True


@dataclass(frozen=True)
class Handle:
    index: int
    mig: int | None = None


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class FakeNvml(types.ModuleType):
    """The pynvml calls the backend makes, over FakeGpu state; also the test's handle on it."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__("fake_pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))
        self.c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
        self.gpus = gpus
        self.init_error: int | None = None
        self.driver = "550.54.15"
        self.events: list[tuple[int, int]] = []  # (gpu index, xid) waiting to be read
        self.calls: list[str] = []
        self.shutdown = False
        self.gpm_live = 0  # GPM samples allocated and not freed

    # ---- how a call reaches a device ---------------------------------------------------

    def _gpu(self, h: Handle, fn: str) -> FakeGpu:
        """The GPU behind a handle; raises as NVML does for a lost GPU or an unsupported call."""
        self.calls.append(fn)
        g = self.gpus[h.index]
        if g.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    # ---- initialisation and system -----------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _err(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    # ---- identity ------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self._gpu(Handle(i), "nvmlDeviceGetHandleByIndex")
        return Handle(i)

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        return h.index

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        g = self._gpu(h, "nvmlDeviceGetUUID")
        if h.mig is not None:
            return g.mig[h.mig].uuid or f"MIG-{g.uuid[4:]}-{g.mig[h.mig].gi}"
        return g.uuid

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Any:
        return _ns(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetName(self, h: Handle) -> str:
        g = self._gpu(h, "nvmlDeviceGetName")
        return g.name if h.mig is None else f"{g.name} MIG {g.mig[h.mig].name}"

    # ---- readings ------------------------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock if clock == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, h: Handle) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replay

    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return g.pcie_tx_kbs if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kbs

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return _ns(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetEncoderUtilization(self, h: Handle) -> list[int]:
        return [self._gpu(h, "nvmlDeviceGetEncoderUtilization").enc, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: Handle) -> list[int]:
        return [self._gpu(h, "nvmlDeviceGetDecoderUtilization").dec, 167000]

    def nvmlDeviceGetVirtualizationMode(self, h: Handle) -> int:
        return self._gpu(h, "nvmlDeviceGetVirtualizationMode").virt_mode

    def nvmlDeviceGetGridLicensableFeatures(self, h: Handle) -> Any:
        self._gpu(h, "nvmlDeviceGetGridLicensableFeatures")
        feature = _ns(featureState=1)
        return _ns(
            isGridLicenseSupported=1, licensableFeaturesCount=1, gridLicensableFeatures=[feature]
        )

    def nvmlDeviceGetFieldValues(self, h: Handle, ids: list[Any]) -> Any:
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        values = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: ("memory_temp", g.mem_temp),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: ("nvlink", g.nvlink_tx_kib),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: ("nvlink", g.nvlink_rx_kib),
        }
        arr = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, requested in enumerate(ids):
            fid = requested[0] if isinstance(requested, tuple) else requested
            arr[i].fieldId = fid
            feature, value = values.get(fid, ("unknown", 0))
            if feature == "unknown" or feature in g.unsupported:
                arr[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif feature == "memory_temp":
                arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                arr[i].value.uiVal = value
            else:
                arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                arr[i].value.ullVal = value
        return arr

    # ---- memory --------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: int | None = None) -> Any:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        total, used, reserved = g.total, g.used, g.reserved
        if h.mig is not None:
            total, used, reserved = g.mig[h.mig].total, g.mig[h.mig].used, 0
        if not version:  # v1: reserved memory counts as used
            return _ns(total=total, free=total - used - reserved, used=used + reserved)
        if not g.memory_v2:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        free = total - reserved - used
        return _ns(version=version, total=total, reserved=reserved, free=free, used=used)

    # ---- errors and health ---------------------------------------------------------------

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        return self._gpu(h, "nvmlDeviceGetRemappedRows").rows

    def nvmlDeviceGetViolationStatus(self, h: Handle, policy: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetViolationStatus")
        return _ns(referenceTime=1, violationTime=g.violation_ns + policy)

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, kind: int, counter: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEccErrors").ecc[(kind, counter)]

    def nvmlDeviceGetRetiredPages(self, h: Handle, cause: int) -> list[int]:
        g = self._gpu(h, "nvmlDeviceGetRetiredPages")
        sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return [0x1000 * i for i in range(g.retired_sbe if cause == sbe else g.retired_dbe)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        return self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    # ---- GPM (profiling metrics) ---------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: Handle) -> Any:
        g = self._gpu(h, "nvmlGpmQueryDeviceSupport")
        return _ns(version=1, isSupportedDevice=1 if g.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> Any:
        self.gpm_live += 1
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: Handle, sample: Any) -> Any:
        self._gpu(h, "nvmlGpmSampleGet")
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.gpm_live -= 1

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        assert req.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        values = self.gpus[0].gpm_values
        for i in range(req.numMetrics):
            metric = req.metrics[i]
            if metric.metricId in values:
                metric.value = values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return req

    # ---- processes -----------------------------------------------------------------------

    def _processes(self, h: Handle, fn: str) -> list[FakeProcess]:
        g = self._gpu(h, fn)
        return g.mig[h.mig].processes if h.mig is not None else g.processes

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        procs = self._processes(h, "nvmlDeviceGetComputeRunningProcesses")
        return [_ns(pid=p.pid, usedGpuMemory=p.used_bytes) for p in procs]

    def nvmlDeviceGetProcessUtilization(self, h: Handle, ts: int) -> list[Any]:
        procs = self._processes(h, "nvmlDeviceGetProcessUtilization")
        samples = [
            _ns(pid=p.pid, timeStamp=ts + 1000, smUtil=p.sm, memUtil=p.mem, encUtil=p.enc,
                decUtil=p.dec)
            for p in procs
            if p.sm is not None
        ]  # fmt: skip
        if not samples:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    # ---- MIG -----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        on = 1 if self._gpu(h, "nvmlDeviceGetMigMode").mig else 0
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return 7 if self._gpu(h, "nvmlDeviceGetMaxMigDeviceCount").mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, i: int) -> Handle:
        if i >= len(self._gpu(h, "nvmlDeviceGetMigDeviceHandleByIndex").mig):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(h.index, i)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        assert h.mig is not None
        return self._gpu(h, "nvmlDeviceGetGpuInstanceId").mig[h.mig].gi

    # ---- events (XID) --------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Handle, types_: int, es: str) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> Any:
        if not self.events:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.events.pop(0)
        return _ns(
            device=Handle(index),
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0,
            computeInstanceId=0,
        )

    def nvmlEventSetFree(self, es: str) -> None:
        return None


FakeState = FakeNvml
"""The fake is also the test's handle on its state (events, calls, init_error...)."""


def make_fake_nvml(gpus: list[FakeGpu]) -> tuple[FakeNvml, FakeNvml]:
    fake = FakeNvml(gpus)
    return fake, fake
