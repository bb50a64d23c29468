"""The NVML backend against a fake NVML module that raises the real bindings' errors."""

from __future__ import annotations

import pynvml
import pytest

from gpu_exporter.backend import BackendUnavailableError
from gpu_exporter.counters import FIELDS
from gpu_exporter.nvml_backend import NvmlBackend
from tests.helpers.fake_nvml import MIB, FakeGpu, FakeMig, FakeProcess, FakeState, make_fake_nvml

ALL = frozenset(FIELDS) - {"DCGM_FI_DRIVER_VERSION"}


def backend_for(*gpus: FakeGpu, processes: bool = True) -> tuple[NvmlBackend, FakeState]:
    module, state = make_fake_nvml(list(gpus))
    return NvmlBackend(module, processes=processes), state


def test_every_metric_and_conversion() -> None:
    b, _ = backend_for(FakeGpu())
    snap = b.collect(ALL, now=1234.5)
    assert snap.timestamp == 1234.5
    assert snap.driver_version == "550.54.15"
    assert snap.failures == ()
    (gpu,) = snap.gpus
    info = gpu.info
    assert info.index == 0
    assert info.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert info.pci_bus_id == "00000000:18:00.0"  # bytes from NVML decoded
    assert info.device == "nvidia0"
    assert info.model_name == "NVIDIA H100 80GB HBM3"
    assert info.memory_total_mib == 81559
    v = gpu.values
    # The first collection has no previous GPM sample except the one taken at start-up.
    assert v == {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_GPU_TEMP": 65,
        "DCGM_FI_DEV_MEMORY_TEMP": 71.0,
        "DCGM_FI_DEV_POWER_USAGE": 312.456,  # mW -> W
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 987_654_321,  # mJ as is
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3,
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 42,
        "DCGM_FI_DEV_ENC_UTIL": 5,
        "DCGM_FI_DEV_DEC_UTIL": 9,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        # bytes -> MiB, rounded down: used = 40000 MiB + 12345 B
        "DCGM_FI_DEV_FB_FREE": 81559 - 530 - 40000 - 1,
        "DCGM_FI_DEV_FB_USED": 40000,
        "DCGM_FI_DEV_FB_RESERVED": 530,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 3345.0,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 4,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": pytest.approx(0.815),  # % -> ratio
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": pytest.approx(0.4225),
        "DCGM_FI_PROF_DRAM_ACTIVE": pytest.approx(0.33),
        "DCGM_FI_PROF_PCIE_TX_BYTES": 10.0 * MIB,  # MiB/s -> B/s
        "DCGM_FI_PROF_PCIE_RX_BYTES": 2.5 * MIB,
        "DCGM_FI_PROF_SM_ACTIVE": pytest.approx(0.9),
        "DCGM_FI_PROF_SM_OCCUPANCY": pytest.approx(0.4),
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": pytest.approx(0.12),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": pytest.approx(0.06),
        "DCGM_FI_DEV_FB_TOTAL": 81559,
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": 1200,  # KB/s as NVML reports it
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": 3400,
        # the fake's violation time is 7 ms + the NVML perf-policy number (ns)
        "DCGM_FI_DEV_POWER_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_POWER,
        "DCGM_FI_DEV_THERMAL_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_THERMAL,
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_SYNC_BOOST,
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        "DCGM_FI_DEV_RELIABILITY_VIOLATION": 7_000_000 + pynvml.NVML_PERF_POLICY_RELIABILITY,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 2,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 11,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 1,
        "DCGM_FI_DEV_RETIRED_SBE": 2,  # pages retired, counted
        "DCGM_FI_DEV_RETIRED_DBE": 1,
        "DCGM_FI_DEV_RETIRED_PENDING": 0,
    }


def test_only_requested_fields_are_read() -> None:
    b, st = backend_for(FakeGpu())
    snap = b.collect(frozenset({"DCGM_FI_DEV_GPU_TEMP"}), now=0)
    assert "nvmlDeviceGetPowerUsage" not in st.calls
    assert snap.gpus[0].values == {"DCGM_FI_DEV_GPU_TEMP": 65}


def test_not_supported_fields_are_absent_not_zero() -> None:
    g = FakeGpu(
        unsupported={
            "nvmlDeviceGetPowerUsage",
            "memory_temp",
            "nvlink",
            "nvmlDeviceGetRemappedRows",
        },
        gpm=False,
    )
    b, _ = backend_for(g)
    v = b.collect(ALL, now=0).gpus[0].values
    for absent in (
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ):
        assert absent not in v
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 65


def test_profiling_metrics_absent_without_gpm() -> None:
    b, _ = backend_for(FakeGpu(gpm=False, name="NVIDIA A100-SXM4-80GB"))
    v = b.collect(ALL, now=0).gpus[0].values
    assert not [k for k in v if k.startswith("DCGM_FI_PROF_")]


def test_gpm_samples_are_freed() -> None:
    b, st = backend_for(FakeGpu())
    for _ in range(5):
        b.collect(ALL, now=0)
    assert st.gpm_live == 1  # the one kept for the next collection
    b.close()
    assert st.gpm_live == 0
    assert st.shutdown


def test_memory_info_v1_fallback_has_no_reserved() -> None:
    b, _ = backend_for(FakeGpu(memory_v2=False))
    v = b.collect(ALL, now=0).gpus[0].values
    assert "DCGM_FI_DEV_FB_RESERVED" not in v
    assert v["DCGM_FI_DEV_FB_USED"] == 40000 + 530  # v1 counts reserved as used


def test_lost_gpu_is_isolated() -> None:
    good = FakeGpu(uuid="GPU-good")
    bad = FakeGpu(uuid="GPU-bad", bus_id=b"00000000:3B:00.0")
    b, _ = backend_for(good, bad)
    bad.lost = True
    snap = b.collect(ALL, now=0)
    assert [g.info.uuid for g in snap.gpus] == ["GPU-good"]
    (failure,) = snap.failures
    assert failure.info.uuid == "GPU-bad"
    assert failure.info.index == 1
    assert "lost" in failure.reason.lower()
    bad.lost = False
    assert len(b.collect(ALL, now=0).gpus) == 2  # recovers when NVML answers again


def test_gpu_lost_at_startup_reported_every_collection() -> None:
    module, st = make_fake_nvml([FakeGpu(), FakeGpu(uuid="GPU-x")])
    st.gpus[1].lost = True
    b = NvmlBackend(module)
    snap = b.collect(ALL, now=0)
    assert len(snap.gpus) == 1
    assert snap.failures[0].info.index == 1
    assert snap.failures[0].info.device == "nvidia1"  # nvidia<index>, as dcgm-exporter


def test_processes_memory_and_utilisation() -> None:
    g = FakeGpu(
        processes=[
            FakeProcess(100, 2048 * MIB + 5, sm=40, mem=20, enc=1, dec=2),
            FakeProcess(200, None, sm=None),  # memory unavailable (None), no util sample
        ]
    )
    b, _ = backend_for(g)
    procs = b.collect(ALL, now=0).gpus[0].processes
    assert [
        (p.pid, p.used_memory_mib, p.sm_util, p.mem_util, p.enc_util, p.dec_util) for p in procs
    ] == [
        (100, 2048, 40, 20, 1, 2),
        (200, 0, 0, 0, 0, 0),
    ]


def test_process_utilisation_not_found_means_zero() -> None:
    g = FakeGpu(processes=[FakeProcess(7, 10 * MIB, sm=None)])
    b, _ = backend_for(g)
    (p,) = b.collect(ALL, now=0).gpus[0].processes
    assert (p.pid, p.used_memory_mib, p.sm_util) == (7, 10, 0)


def test_processes_skipped_when_disabled() -> None:
    g = FakeGpu(processes=[FakeProcess(7, 10 * MIB, sm=3)])
    b, st = backend_for(g, processes=False)
    assert b.collect(ALL, now=0).gpus[0].processes == ()
    assert "nvmlDeviceGetComputeRunningProcesses" not in st.calls


def test_xid_events_set_last_xid() -> None:
    b, st = backend_for(FakeGpu(), FakeGpu(uuid="GPU-2"))
    st.events += [(1, 13), (1, 79), (0, 31)]
    snap = b.collect(ALL, now=0)
    assert [g.values["DCGM_FI_DEV_XID_ERRORS"] for g in snap.gpus] == [31, 79]
    assert [g.values["DCGM_FI_DEV_XID_ERRORS"] for g in b.collect(ALL, now=1).gpus] == [31, 79]


def test_vgpu_license_status() -> None:
    b, _ = backend_for(FakeGpu(virt_mode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU))
    assert b.collect(ALL, now=0).gpus[0].values["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] == 1


def test_mig_instances_get_their_own_memory_and_processes() -> None:
    g = FakeGpu(
        name="NVIDIA A100-SXM4-40GB",
        gpm=False,
        mig=[
            FakeMig(1, "1g.5gb", 4864 * MIB, 100 * MIB, [FakeProcess(42, 90 * MIB)]),
            FakeMig(2, "3g.20gb", 19968 * MIB, 0),
        ],
    )
    b, _ = backend_for(g)
    parent, mig1, mig2 = b.collect(ALL, now=0).gpus
    assert "DCGM_FI_DEV_FB_USED" not in parent.values  # memory is per instance under MIG
    assert parent.values["DCGM_FI_DEV_GPU_TEMP"] == 65
    assert (mig1.info.mig_profile, mig1.info.mig_instance) == ("1g.5gb", 1)
    assert mig1.info.uuid == parent.info.uuid
    assert mig1.info.mig_uuid.startswith("MIG-") and mig1.info.mig_uuid != mig2.info.mig_uuid
    assert mig1.values["DCGM_FI_DEV_FB_USED"] == 100
    assert mig1.values["DCGM_FI_DEV_FB_FREE"] == 4864 - 100
    assert [p.pid for p in mig1.processes] == [42]
    assert (mig2.info.mig_profile, mig2.info.memory_total_mib) == ("3g.20gb", 19968)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_missing_nvml_is_a_clear_startup_error(code: int) -> None:
    module, st = make_fake_nvml([])
    st.init_error = code
    with pytest.raises(BackendUnavailableError) as info:
        NvmlBackend(module)
    message = str(info.value)
    assert "install the NVIDIA driver" in message
    assert "--simulate" in message


def test_real_pynvml_without_driver_fails_clearly() -> None:
    try:
        b = NvmlBackend()
    except BackendUnavailableError as exc:
        assert "--simulate" in str(exc)
    else:  # a machine with a GPU: the backend works
        assert b.collect(ALL, now=0) is not None
        b.close()
