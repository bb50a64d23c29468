"""The DCGM backend against a fake host engine shaped like DCGM's Python bindings: profiling
fields from DCGM per GPU and per MIG instance, on a GPU where NVML has no GPM."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.counters import FIELDS
from gpu_exporter.dcgm_backend import (
    PROFILING,
    DcgmBindings,
    load_bindings,
    open_dcgm_backend,
)
from gpu_exporter.nvml_backend import NvmlBackend
from tests.helpers.fake_nvml import MIB, FakeGpu, FakeMig, make_fake_nvml

FE_GPU, FE_GPU_I = 1, 6
FIELD_IDS = {name: 1000 + i for i, name in enumerate(PROFILING)}
A100 = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
MIG_GPU = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


@dataclass
class HostEngine:
    """What nv-hostengine knows: GPUs by DCGM id, GPU instances, latest values per entity."""

    gpus: dict[int, str]
    instances: dict[int, tuple[int, int]]  # entity id -> (parent GPU id, NVML GI id)
    values: dict[tuple[int, int], dict[int, float]]
    up: bool = True
    readers: list[Any] = field(default_factory=list)

    def bindings(self) -> DcgmBindings:
        engine = self

        class Handle:
            def __init__(self, ipAddress: str, opMode: int) -> None:
                if not engine.up:
                    raise ConnectionError("Host engine connection invalid/disconnected")
                self.handle = 7

            def GetSystem(self) -> Any:
                attributes = {i: ns(identifiers=ns(uuid=u)) for i, u in engine.gpus.items()}
                return ns(
                    discovery=ns(
                        GetAllSupportedGpuIds=lambda: list(engine.gpus),
                        GetGpuAttributes=attributes.__getitem__,
                    )
                )

        class Reader:
            def __init__(self, **kw: Any) -> None:
                self.kw, self.handle, self.shut = kw, None, False
                engine.readers.append(self)

            def SetHandle(self, handle: int) -> None:
                self.handle = handle

            def GetLatestEntityValuesAsFieldIdDict(self) -> dict[int, dict[int, dict[int, float]]]:
                out: dict[int, dict[int, dict[int, float]]] = {}
                for (group, entity), fields in engine.values.items():
                    out.setdefault(group, {})[entity] = dict(fields)
                return out

            def Shutdown(self) -> None:
                self.shut = True

        def hierarchy(handle: int) -> Any:
            entries = [
                ns(
                    entity=ns(entityGroupId=FE_GPU_I, entityId=eid),
                    parent=ns(entityGroupId=FE_GPU, entityId=parent),
                    info=ns(nvmlInstanceId=gi),
                )
                for eid, (parent, gi) in engine.instances.items()
            ]
            return ns(count=len(entries), entityList=entries)

        fields = types.ModuleType("dcgm_fields")
        for name, fid in FIELD_IDS.items():
            setattr(fields, name, fid)
        fields.DCGM_FE_GPU, fields.DCGM_FE_GPU_I = FE_GPU, FE_GPU_I  # type: ignore[attr-defined]
        structs = ns(DCGM_OPERATION_MODE_AUTO=1, c_dcgmGroupEntityPair_t=lambda g, e: (g, e))
        return DcgmBindings(
            Reader,
            ns(DcgmHandle=Handle),  # type: ignore[arg-type]
            fields,
            structs,  # type: ignore[arg-type]
            ns(dcgmGetGpuInstanceHierarchy=hierarchy),  # type: ignore[arg-type]
        )


def nvml_backend() -> NvmlBackend:
    a100 = FakeGpu(uuid=A100, name="NVIDIA A100-SXM4-80GB", gpm=False)
    mig = FakeGpu(
        uuid=MIG_GPU,
        bus_id=b"00000000:3B:00.0",
        gpm=False,
        mig=[FakeMig(1, "3g.40gb", 40192 * MIB, 100 * MIB), FakeMig(5, "2g.20gb", 19968 * MIB, 0)],
    )
    module, _ = make_fake_nvml([a100, mig])
    return NvmlBackend(module)


def engine() -> HostEngine:
    gr, tensor = (
        FIELD_IDS["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
        FIELD_IDS["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"],
    )
    return HostEngine(
        gpus={0: A100, 1: MIG_GPU},
        instances={10: (1, 1), 11: (1, 5)},
        values={
            (FE_GPU, 0): {gr: 0.75, tensor: 0.5},
            (FE_GPU_I, 10): {gr: 0.25},
            (FE_GPU_I, 11): {gr: 0.125, 999: 1.0},  # a field nobody asked for: ignored
        },
    )


def test_profiling_from_dcgm_per_gpu_and_per_mig_instance() -> None:
    host = engine()
    backend = open_dcgm_backend(nvml_backend(), interval_s=30.0, bindings=host.bindings())
    assert backend is not None and backend.name.startswith("dcgm+nvml(")
    (reader,) = host.readers
    assert reader.handle == 7 and reader.kw["updateFrequency"] == 30_000_000
    assert sorted(reader.kw["entities"]) == [
        (FE_GPU, 0),
        (FE_GPU, 1),
        (FE_GPU_I, 10),
        (FE_GPU_I, 11),
    ]
    snap = backend.collect(frozenset(FIELDS), 0.0)
    a100, parent, gi1, gi5 = snap.gpus
    # NVML has no GPM on this A100: the profiling fields are DCGM's
    assert a100.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.75
    assert a100.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.5
    assert a100.values["DCGM_FI_DEV_GPU_TEMP"] == 65  # the rest from NVML
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in parent.values
    assert (gi1.info.mig_instance, gi1.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == (1, 0.25)
    assert (gi5.info.mig_instance, gi5.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == (5, 0.125)
    only_temp = backend.collect(frozenset({"DCGM_FI_DEV_GPU_TEMP"}), 0.0)
    assert all("DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in g.values for g in only_temp.gpus)
    backend.close()
    assert reader.shut


def test_no_host_engine_means_nvml_alone(caplog: pytest.LogCaptureFixture) -> None:
    host = engine()
    host.up = False
    assert open_dcgm_backend(nvml_backend(), interval_s=30.0, bindings=host.bindings()) is None
    assert "dcgm host engine not usable" in caplog.text
    assert open_dcgm_backend(nvml_backend(), interval_s=30.0, bindings=None) is None


def test_bindings_missing_here(tmp_path: Path) -> None:
    assert load_bindings(tmp_path / "no-dcgm") is None  # this machine has no DCGM package
