"""The NVML backend: reads real GPUs through pynvml (the ``nvidia-ml-py`` package).

The NVML module is injectable (``NvmlBackend(nvml=fake)``) so the whole backend is tested
against a fake that raises the same ``NVMLError`` subclasses as the real bindings.

Failure isolation: a call that fails with NOT_SUPPORTED (or any non-fatal NVML error) leaves
that one field out; a fatal error for the device (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN) turns
the whole GPU into a `GpuFailure` for this collection, and the other GPUs are unaffected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpu_exporter.backend import (
    BackendUnavailableError,
    GpuFailure,
    GpuInfo,
    GpuSample,
    ProcessSample,
    Snapshot,
)
from gpu_exporter.nvml_fields import (
    ECC,
    GPM_FIELDS,
    MEMORY_FIELDS,
    MIB,
    RETIRED,
    VIOLATIONS,
    attr,
    field_value,
    length,
    milli,
)

__all__ = ["MIB", "NvmlBackend"]

log = logging.getLogger(__name__)

_UINT_MAX = 0xFFFFFFFF
_FATAL_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_Unknown")
_INSTALL_HINT = (
    "install the NVIDIA driver (it ships libnvidia-ml.so.1) and run where /dev/nvidia* is "
    "visible, or run without a GPU with --simulate N"
)


class _GpuLostError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class _Device:
    info: GpuInfo
    handle: Any
    gpm: bool = False
    gpm_prev: Any = None
    last_util_ts: int = 0
    last_xid: int = 0
    lost: str = ""
    mig: list[tuple[GpuInfo, Any]] = field(default_factory=list)


class NvmlBackend:
    """GPUs read through NVML. Construct once; `collect` is called from a worker thread."""

    def __init__(self, nvml: ModuleType | None = None, *, processes: bool = True) -> None:
        if nvml is None:
            try:
                import pynvml

                nvml = pynvml
            except ImportError as exc:
                raise BackendUnavailableError(
                    f"the pynvml module (package nvidia-ml-py) is missing: pip install "
                    f"nvidia-ml-py; {_INSTALL_HINT}"
                ) from exc
        self._nvml = nvml
        self._processes = processes
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendUnavailableError(
                f"NVML is not available ({exc}): {_INSTALL_HINT}"
            ) from exc
        self.driver_version = self._call_or("", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        self._devices = [self._open_device(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._events = self._open_events()

    @property
    def name(self) -> str:
        return f"nvml({len(self._devices)} GPUs, driver {self.driver_version})"

    # ---- setup -------------------------------------------------------------------------

    def _call_or(self, default: Any, fn: Any) -> Any:
        try:
            return fn()
        except self._nvml.NVMLError:
            return default

    def _open_device(self, index: int) -> _Device:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            total = self._call_or(0, lambda: n.nvmlDeviceGetMemoryInfo(handle).total)
            info = GpuInfo(
                index=index,
                uuid=_text(n.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(n.nvmlDeviceGetPciInfo(handle).busId),
                device=f"nvidia{index}",  # dcgm-exporter: nvidia<index>, not the minor
                model_name=_text(n.nvmlDeviceGetName(handle)),
                memory_total_mib=int(total) // MIB,
            )
        except n.NVMLError as exc:
            log.warning("gpu unusable index=%d error=%s", index, exc)
            info = GpuInfo(index, "", "", f"nvidia{index}", "")
            return _Device(info, None, lost=str(exc))
        dev = _Device(info, handle)
        support = self._call_or(None, lambda: n.nvmlGpmQueryDeviceSupport(handle))
        if support is not None and bool(getattr(support, "isSupportedDevice", False)):
            dev.gpm = True
            dev.gpm_prev = self._call_or(None, lambda: self._gpm_sample(handle))
        dev.mig = self._open_mig(handle, info)
        return dev

    def _open_mig(self, handle: Any, parent: GpuInfo) -> list[tuple[GpuInfo, Any]]:
        n = self._nvml
        mode = self._call_or(None, lambda: n.nvmlDeviceGetMigMode(handle))
        if not mode or mode[0] != 1:
            return []
        out = []
        for i in range(self._call_or(0, lambda: n.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                gi = int(n.nvmlDeviceGetGpuInstanceId(mig))
                mig_uuid = _text(n.nvmlDeviceGetUUID(mig))
                name = _text(n.nvmlDeviceGetName(mig))
                total = int(n.nvmlDeviceGetMemoryInfo(mig).total) // MIB
            except n.NVMLError:
                continue
            profile = name.rsplit("MIG ", 1)[-1] if "MIG " in name else name
            info = GpuInfo(
                parent.index,
                parent.uuid,
                parent.pci_bus_id,
                parent.device,
                parent.model_name,
                total,
                mig_profile=profile,
                mig_instance=gi,
                mig_uuid=mig_uuid,
            )
            out.append((info, mig))
        return out

    def _open_events(self) -> Any:
        n = self._nvml
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError:
            return None
        for dev in self._devices:
            if dev.handle is not None:
                self._call_or(
                    None,
                    lambda h=dev.handle: n.nvmlDeviceRegisterEvents(
                        h, n.nvmlEventTypeXidCriticalError, events
                    ),
                )
        return events

    def _gpm_sample(self, handle: Any) -> Any:
        sample = self._nvml.nvmlGpmSampleAlloc()
        return self._nvml.nvmlGpmSampleGet(handle, sample)

    # ---- collection --------------------------------------------------------------------

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        self._drain_xid_events()
        gpus: list[GpuSample] = []
        failures: list[GpuFailure] = []
        for dev in self._devices:
            if dev.lost:
                failures.append(GpuFailure(dev.info, dev.lost))
                continue
            try:
                gpus.append(self._sample(dev, fields))
                gpus.extend(self._sample_mig(dev, fields))
            except _GpuLostError as exc:
                log.warning(
                    "gpu read failed gpu=%d uuid=%s error=%s",
                    dev.info.index,
                    dev.info.uuid,
                    exc.reason,
                )
                failures.append(GpuFailure(dev.info, exc.reason))
        return Snapshot(now, self.driver_version, tuple(gpus), tuple(failures))

    def _try(self, fn: Any, *args: Any) -> Any:
        """Call fn; None when the field is unavailable; _GpuLostError when the GPU is gone."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if type(exc).__name__ in _FATAL_ERRORS:
                raise _GpuLostError(str(exc)) from exc
            return None

    def _drain_xid_events(self) -> None:
        n = self._nvml
        if self._events is None:
            return
        by_index = {d.info.index: d for d in self._devices}
        for _ in range(1024):
            try:
                data = n.nvmlEventSetWait(self._events, 0)
            except n.NVMLError:
                return
            if data.eventType & n.nvmlEventTypeXidCriticalError:
                index = self._call_or(None, lambda d=data: n.nvmlDeviceGetIndex(d.device))
                if index in by_index:
                    by_index[index].last_xid = int(data.eventData)

    def _sample(self, dev: _Device, fields: frozenset[str]) -> GpuSample:
        """Read the wanted fields of one GPU; an NVML call is made only for a wanted field."""
        v: dict[str, float] = {}
        for name, read in self._readers(dev).items():
            if name in fields:
                value = read()
                if value is not None:
                    v[name] = value
        h = dev.handle
        if not dev.mig:
            v.update(self._memory(h, fields))
        if dev.gpm and any(f in fields for f in GPM_FIELDS):
            v.update(self._gpm(dev, fields))
        procs = self._process_samples(dev, h) if self._processes and not dev.mig else ()
        return GpuSample(dev.info, v, procs)

    def _readers(self, dev: _Device) -> dict[str, Any]:
        """Field name -> reader of that field on one GPU. Nothing is read until a reader
        is called; fields that come from one NVML call share it (one call per sample)."""
        n, h, t = self._nvml, dev.handle, self._try
        shared: dict[str, Any] = {}

        def once(key: str, fn: Any) -> Any:  # one call feeds several fields
            if key not in shared:
                shared[key] = t(fn, h)
            return shared[key]

        def item(key: str, fn: Any, index: int | str) -> Any:
            value = once(key, fn)
            if value is None:
                return None
            return getattr(value, index) if isinstance(index, str) else value[index]

        nvlink = [
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, _UINT_MAX),
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, _UINT_MAX),
        ]
        readers: dict[str, Any] = {
            "DCGM_FI_DEV_SM_CLOCK": lambda: t(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "DCGM_FI_DEV_MEM_CLOCK": lambda: t(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "DCGM_FI_DEV_GPU_TEMP": lambda: t(
                n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU
            ),
            "DCGM_FI_DEV_MEMORY_TEMP": lambda: self._field_values(h, [n.NVML_FI_DEV_MEMORY_TEMP]),
            "DCGM_FI_DEV_POWER_USAGE": lambda: milli(t(n.nvmlDeviceGetPowerUsage, h)),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda: t(
                n.nvmlDeviceGetTotalEnergyConsumption, h
            ),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda: t(n.nvmlDeviceGetPcieReplayCounter, h),
            "DCGM_FI_DEV_GPU_UTIL": lambda: item("util", n.nvmlDeviceGetUtilizationRates, "gpu"),
            "DCGM_FI_DEV_MEM_COPY_UTIL": lambda: item(
                "util", n.nvmlDeviceGetUtilizationRates, "memory"
            ),
            "DCGM_FI_DEV_ENC_UTIL": lambda: item("enc", n.nvmlDeviceGetEncoderUtilization, 0),
            "DCGM_FI_DEV_DEC_UTIL": lambda: item("dec", n.nvmlDeviceGetDecoderUtilization, 0),
            "DCGM_FI_DEV_XID_ERRORS": lambda: dev.last_xid,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda: self._field_values(h, nvlink),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": lambda: self._vgpu_license(h),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda: item(
                "rows", n.nvmlDeviceGetRemappedRows, 0
            ),
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda: item(
                "rows", n.nvmlDeviceGetRemappedRows, 1
            ),
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda: (
                None
                if once("rows", n.nvmlDeviceGetRemappedRows) is None
                else int(bool(shared["rows"][3]))
            ),
        }
        readers.update(self._error_readers(h))
        return readers

    def _error_readers(self, h: Any) -> dict[str, Any]:
        """Readers of the throughput, violation, ECC and retired-page fields."""
        n, t = self._nvml, self._try
        readers: dict[str, Any] = {
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": lambda: t(
                n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES
            ),
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": lambda: t(
                n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES
            ),
            "DCGM_FI_DEV_RETIRED_PENDING": lambda: t(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
        }
        for name, policy in VIOLATIONS.items():
            readers[name] = lambda p=policy: attr(
                t(n.nvmlDeviceGetViolationStatus, h, getattr(n, p)), "violationTime"
            )
        for name, (kind, counter) in ECC.items():
            readers[name] = lambda k=kind, c=counter: t(
                n.nvmlDeviceGetTotalEccErrors, h, getattr(n, k), getattr(n, c)
            )
        for name, cause in RETIRED.items():
            readers[name] = lambda c=cause: length(t(n.nvmlDeviceGetRetiredPages, h, getattr(n, c)))
        return readers

    def _sample_mig(self, dev: _Device, fields: frozenset[str]) -> list[GpuSample]:
        out = []
        for info, mig in dev.mig:
            values = self._memory(mig, fields)
            procs = self._process_samples(dev, mig, utilisation=False) if self._processes else ()
            out.append(GpuSample(info, values, procs))
        return out

    def _memory(self, h: Any, fields: frozenset[str]) -> dict[str, float]:
        n = self._nvml
        if not any(f in fields for f in MEMORY_FIELDS):
            return {}
        mem = self._try(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
        reserved: int | None = None
        if mem is None:
            mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
            if mem is None:
                return {}
        else:
            reserved = int(mem.reserved) // MIB
        out: dict[str, float] = {
            "DCGM_FI_DEV_FB_FREE": int(mem.free) // MIB,
            "DCGM_FI_DEV_FB_USED": int(mem.used) // MIB,
            "DCGM_FI_DEV_FB_TOTAL": int(mem.total) // MIB,
        }
        if reserved is not None:
            out["DCGM_FI_DEV_FB_RESERVED"] = reserved
        return {k: val for k, val in out.items() if k in fields}

    def _field_values(self, h: Any, ids: list[Any]) -> float | None:
        """Sum of NVML field values; None unless every one of them was read."""
        n = self._nvml
        values = self._try(n.nvmlDeviceGetFieldValues, h, ids)
        if values is None:
            return None
        total = 0.0
        for fv in values:
            if fv.nvmlReturn != n.NVML_SUCCESS:
                if fv.nvmlReturn == n.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLostError("GPU is lost")
                return None
            total += field_value(n, fv)
        return total

    def _vgpu_license(self, h: Any) -> int | None:
        n = self._nvml
        mode = self._try(n.nvmlDeviceGetVirtualizationMode, h)
        if mode is None:
            return None
        if mode != n.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            return 0
        features = self._try(n.nvmlDeviceGetGridLicensableFeatures, h)
        if features is None:
            return None
        count = int(features.licensableFeaturesCount)
        states = [features.gridLicensableFeatures[i].featureState for i in range(count)]
        return 1 if any(states) else 0

    def _gpm(self, dev: _Device, fields: frozenset[str]) -> dict[str, float]:
        n = self._nvml
        try:
            current = self._gpm_sample(dev.handle)
        except n.NVMLError as exc:
            if type(exc).__name__ in _FATAL_ERRORS:
                raise _GpuLostError(str(exc)) from exc
            return {}
        previous, dev.gpm_prev = dev.gpm_prev, current
        if previous is None:
            return {}
        wanted = [f for f in GPM_FIELDS if f in fields]
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = previous
        request.sample2 = current
        for i, f in enumerate(wanted):
            request.metrics[i].metricId = getattr(n, GPM_FIELDS[f][0])
        try:
            result = n.nvmlGpmMetricsGet(request)
        except n.NVMLError:
            return {}
        finally:
            self._call_or(None, lambda: n.nvmlGpmSampleFree(previous))
        out: dict[str, float] = {}
        for i, f in enumerate(wanted):
            metric = result.metrics[i]
            if metric.nvmlReturn == n.NVML_SUCCESS:
                out[f] = float(metric.value) * GPM_FIELDS[f][1]
        return out

    def _process_samples(
        self, dev: _Device, h: Any, *, utilisation: bool = True
    ) -> tuple[ProcessSample, ...]:
        n = self._nvml
        running = self._try(n.nvmlDeviceGetComputeRunningProcesses, h)
        if not running:
            return ()
        util: dict[int, Any] = {}
        if utilisation:
            try:
                samples = n.nvmlDeviceGetProcessUtilization(h, dev.last_util_ts)
            except n.NVMLError as exc:
                if type(exc).__name__ in _FATAL_ERRORS:
                    raise _GpuLostError(str(exc)) from exc
                samples = []  # NOT_FOUND: no sample since the last one, i.e. 0 %
            for s in samples:
                if s.pid not in util or s.timeStamp > util[s.pid].timeStamp:
                    util[s.pid] = s
                dev.last_util_ts = max(dev.last_util_ts, int(s.timeStamp))
        out = []
        for p in running:
            mem = p.usedGpuMemory
            s = util.get(p.pid)
            out.append(
                ProcessSample(
                    pid=int(p.pid),
                    used_memory_mib=0 if mem is None else int(mem) // MIB,
                    sm_util=int(s.smUtil) if s else 0,
                    mem_util=int(s.memUtil) if s else 0,
                    enc_util=int(s.encUtil) if s else 0,
                    dec_util=int(s.decUtil) if s else 0,
                )
            )
        return tuple(out)

    def close(self) -> None:
        n = self._nvml
        if self._events is not None:
            self._call_or(None, lambda: n.nvmlEventSetFree(self._events))
            self._events = None
        for dev in self._devices:
            if dev.gpm_prev is not None:
                self._call_or(None, lambda d=dev: n.nvmlGpmSampleFree(d.gpm_prev))
                dev.gpm_prev = None
        self._call_or(None, n.nvmlShutdown)
