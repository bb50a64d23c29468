"""The DCGM backend: NVML for identity, MIG layout, processes and device fields, NVIDIA's DCGM
host engine (``nv-hostengine``) for the profiling fields (``DCGM_FI_PROF_*``), which replace
NVML GPM's where DCGM has a value.

DCGM's profiling module serves those fields on Volta and later and per MIG GPU instance, where
NVML's GPM serves them only on Hopper and later and never per instance. It needs the host engine
running and DCGM's Python bindings (``DcgmReader``, ``pydcgm``, ``dcgm_fields``, ``dcgm_structs``,
``dcgm_agent``), which ship with the ``datacenter-gpu-manager`` package under
``/usr/local/dcgm/bindings/python3``; they are not on PyPI.

`open_dcgm_backend` returns None (one log line saying why) when either is missing, and the
exporter uses NVML alone. The bindings are injectable (``DcgmBindings``) so the backend is tested
against a fake host engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_exporter.backend import GpuSample, Snapshot
from gpu_exporter.counters import FIELDS
from gpu_exporter.nvml_backend import NvmlBackend

__all__ = ["BINDINGS_PATH", "DcgmBackend", "DcgmBindings", "load_bindings", "open_dcgm_backend"]

log = logging.getLogger(__name__)

BINDINGS_PATH = Path("/usr/local/dcgm/bindings/python3")
PROFILING = tuple(name for name, spec in FIELDS.items() if spec.profiling)


@dataclass(frozen=True, slots=True)
class DcgmBindings:
    """The DCGM Python modules the backend uses."""

    DcgmReader: Any
    pydcgm: ModuleType
    dcgm_fields: ModuleType
    dcgm_structs: ModuleType
    dcgm_agent: ModuleType


def load_bindings(path: Path = BINDINGS_PATH) -> DcgmBindings | None:
    """DCGM's Python bindings, from the DCGM package's folder or the import path; else None."""
    if path.is_dir() and str(path) not in sys.path:
        sys.path.append(str(path))
    try:
        modules = {
            name: importlib.import_module(name)
            for name in ("DcgmReader", "pydcgm", "dcgm_fields", "dcgm_structs", "dcgm_agent")
        }
    except Exception as exc:  # not installed, or a broken install: NVML alone
        log.info("dcgm bindings not available (%s): profiling fields from NVML GPM only", exc)
        return None
    return DcgmBindings(
        modules["DcgmReader"].DcgmReader,
        modules["pydcgm"],
        modules["dcgm_fields"],
        modules["dcgm_structs"],
        modules["dcgm_agent"],
    )


class DcgmBackend:
    """NVML's snapshot with the profiling fields replaced by DCGM's, per GPU and MIG instance."""

    def __init__(
        self, nvml: NvmlBackend, dcgm: DcgmBindings, *, host: str = "localhost", interval_s: float
    ) -> None:
        self._nvml = nvml
        self._dcgm = dcgm
        f = dcgm.dcgm_fields
        self._ids = {name: getattr(f, name) for name in PROFILING if hasattr(f, name)}
        self._names = {v: k for k, v in self._ids.items()}
        self._handle = dcgm.pydcgm.DcgmHandle(
            ipAddress=host, opMode=dcgm.dcgm_structs.DCGM_OPERATION_MODE_AUTO
        )
        self._entities = self._discover()
        pairs = [dcgm.dcgm_structs.c_dcgmGroupEntityPair_t(g, e) for g, e in self._entities]
        self._reader = dcgm.DcgmReader(
            fieldIds=list(self._ids.values()),
            updateFrequency=max(int(interval_s * 1_000_000), 100_000),
            entities=pairs,
            fieldGroupName="raven_gpu_exporter",
        )
        self._reader.SetHandle(self._handle.handle)

    @property
    def name(self) -> str:
        return f"dcgm+{self._nvml.name}"

    def _discover(self) -> dict[tuple[int, int], tuple[str, int | None]]:
        """(entity group, entity id) -> (GPU UUID, MIG GPU-instance id or None)."""
        f = self._dcgm.dcgm_fields
        system = self._handle.GetSystem()
        out: dict[tuple[int, int], tuple[str, int | None]] = {}
        for gpu_id in system.discovery.GetAllSupportedGpuIds():
            uuid = str(system.discovery.GetGpuAttributes(gpu_id).identifiers.uuid)
            out[(f.DCGM_FE_GPU, int(gpu_id))] = (uuid, None)
        hierarchy = self._dcgm.dcgm_agent.dcgmGetGpuInstanceHierarchy(self._handle.handle)
        for i in range(int(hierarchy.count)):
            item = hierarchy.entityList[i]
            if item.entity.entityGroupId == f.DCGM_FE_GPU_I:
                parent = out.get((f.DCGM_FE_GPU, int(item.parent.entityId)))
                if parent is not None:
                    key = (f.DCGM_FE_GPU_I, int(item.entity.entityId))
                    out[key] = (parent[0], int(item.info.nvmlInstanceId))
        return out

    def _profiling(self) -> dict[tuple[str, int | None], dict[str, float]]:
        values = self._reader.GetLatestEntityValuesAsFieldIdDict()
        out: dict[tuple[str, int | None], dict[str, float]] = {}
        for group, entities in values.items():
            for entity, fields in entities.items():
                target = self._entities.get((group, entity))
                if target is not None:
                    out[target] = {
                        self._names[fid]: float(v)
                        for fid, v in fields.items()
                        if fid in self._names
                    }
        return out

    def collect(self, fields: frozenset[str], now: float) -> Snapshot:
        snapshot = self._nvml.collect(fields, now)  # GPM where DCGM has no value
        wanted = fields & set(self._ids)
        if not wanted:
            return snapshot
        prof = self._profiling()
        gpus = tuple(self._merge(g, prof, wanted) for g in snapshot.gpus)
        return dataclasses.replace(snapshot, gpus=gpus)

    @staticmethod
    def _merge(
        gpu: GpuSample,
        prof: dict[tuple[str, int | None], dict[str, float]],
        wanted: frozenset[str],
    ) -> GpuSample:
        key = (gpu.info.uuid, gpu.info.mig_instance if gpu.info.mig_profile else None)
        extra = {k: v for k, v in prof.get(key, {}).items() if k in wanted}
        if not extra:
            return gpu
        return dataclasses.replace(gpu, values={**gpu.values, **extra})

    def close(self) -> None:
        try:
            self._reader.Shutdown()
            shutdown = getattr(self._handle, "Shutdown", None)
            if shutdown is not None:
                shutdown()
        finally:
            self._nvml.close()


def open_dcgm_backend(
    nvml: NvmlBackend, *, host: str = "localhost", interval_s: float, bindings: DcgmBindings | None
) -> DcgmBackend | None:
    """The DCGM backend, or None (one log line) when the host engine cannot be reached."""
    if bindings is None:
        return None
    try:
        return DcgmBackend(nvml, bindings, host=host, interval_s=interval_s)
    except Exception as exc:  # no nv-hostengine, no profiling module: NVML alone
        log.warning("dcgm host engine not usable host=%s error=%s: NVML alone", host, exc)
        return None
