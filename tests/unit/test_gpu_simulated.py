"""The simulated backend: deterministic, a pure function of (seed, time), physically sane."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_exporter.counters import FIELDS
from gpu_exporter.simulated import (
    BOOT_TIME_S,
    LOAD_PROFILES,
    MODELS,
    SimulatedBackend,
    _phase,
    utilisation,
)

ALL = frozenset(FIELDS)
T0 = 1_763_780_000.0


def test_same_seed_and_time_same_snapshot() -> None:
    a = SimulatedBackend(4, seed=3, load_profile="mixed").collect(ALL, T0)
    b = SimulatedBackend(4, seed=3, load_profile="mixed").collect(ALL, T0)
    assert a == b
    c = SimulatedBackend(4, seed=4, load_profile="mixed").collect(ALL, T0)
    assert [g.info.uuid for g in a.gpus] != [g.info.uuid for g in c.gpus]


def test_values_follow_the_documented_formula() -> None:
    backend = SimulatedBackend(1, seed=5, load_profile="training")
    for t in (T0, T0 + 7.5, T0 + 3600):
        g = backend.collect(ALL, t).gpus[0]
        u = utilisation("training", _phase(5, 0), t)
        m = MODELS["H100"]
        assert g.values["DCGM_FI_DEV_GPU_UTIL"] == round(100 * u)
        assert g.values["DCGM_FI_DEV_POWER_USAGE"] == round(
            m.idle_power_w + (m.max_power_w - m.idle_power_w) * u, 3
        )
        assert g.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == round(u, 6)


@pytest.mark.parametrize("profile", LOAD_PROFILES)
def test_energy_counter_is_the_integral_of_power(profile: str) -> None:
    backend = SimulatedBackend(2, seed=1, load_profile=profile)
    t, dt, steps = T0, 0.05, 2000
    energy0 = [
        g.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] for g in backend.collect(ALL, t).gpus
    ]
    integral = [0.0, 0.0]
    for i in range(steps):
        snap = backend.collect(ALL, t + (i + 0.5) * dt)
        for k, g in enumerate(snap.gpus):
            integral[k] += g.values["DCGM_FI_DEV_POWER_USAGE"] * dt * 1000
    energy1 = [
        g.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
        for g in backend.collect(ALL, t + steps * dt).gpus
    ]
    for k in range(2):
        assert energy1[k] - energy0[k] == pytest.approx(integral[k], rel=0.01)
        assert energy1[k] >= energy0[k]


def test_counters_never_decrease() -> None:
    backend = SimulatedBackend(2, seed=9, load_profile="bursty")
    prev = None
    for i in range(200):
        vals = [
            (
                g.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"],
                g.values["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"],
            )
            for g in backend.collect(ALL, T0 + i * 1.7).gpus
        ]
        if prev is not None:
            assert all(
                a >= b
                for now, before in zip(vals, prev, strict=True)
                for a, b in zip(now, before, strict=True)
            )
        prev = vals


@pytest.mark.parametrize("model", sorted(MODELS))
def test_memory_adds_up_and_processes_fit(model: str) -> None:
    snap = SimulatedBackend(4, model=model, load_profile="mixed").collect(ALL, T0)
    m = MODELS[model]
    for g in snap.gpus:
        v = g.values
        assert (
            v["DCGM_FI_DEV_FB_FREE"] + v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_RESERVED"]
            == m.memory_total_mib
        )
        assert v["DCGM_FI_DEV_FB_USED"] == sum(p.used_memory_mib for p in g.processes)
        assert 0 <= v["DCGM_FI_DEV_GPU_UTIL"] <= 100
        assert all(p.pod is not None for p in g.processes)
        assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in v  # a DCGM node: Volta and later
        assert ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in v) == m.nvlink


def test_profiles_shape_load() -> None:
    idle = SimulatedBackend(1, load_profile="idle").collect(ALL, T0).gpus[0]
    assert idle.values["DCGM_FI_DEV_GPU_UTIL"] == 0 and idle.processes == () and idle.pod is None
    train = SimulatedBackend(1, load_profile="training").collect(ALL, T0).gpus[0]
    assert train.values["DCGM_FI_DEV_GPU_UTIL"] >= 84
    infer = SimulatedBackend(1, load_profile="inference").collect(ALL, T0).gpus[0]
    assert len(infer.processes) == 1 and infer.pod is not None
    bursty = [utilisation("bursty", 0.0, T0 + s) for s in range(30)]
    assert set(bursty) == {0.95, 0.05}


def test_failing_gpus_and_fields_filter() -> None:
    snap = SimulatedBackend(3, failing=[1]).collect(frozenset({"DCGM_FI_DEV_GPU_TEMP"}), T0)
    assert [g.info.index for g in snap.gpus] == [0, 2]
    assert [f.info.index for f in snap.failures] == [1]
    assert all(set(g.values) == {"DCGM_FI_DEV_GPU_TEMP"} for g in snap.gpus)


def test_clock_override_and_bad_arguments() -> None:
    snap = SimulatedBackend(1, clock=lambda: BOOT_TIME_S + 10).collect(ALL, 0.0)
    assert snap.timestamp == BOOT_TIME_S + 10
    with pytest.raises(ValueError, match="model"):
        SimulatedBackend(1, model="Voodoo 2")
    with pytest.raises(ValueError, match="sharing"):
        SimulatedBackend(1, sharing="vgpu")
    with pytest.raises(ValueError, match="no MIG"):
        SimulatedBackend(1, model="T4", sharing="mig")
    with pytest.raises(ValueError, match="load profile"):
        SimulatedBackend(1, load_profile="heavy")
    with pytest.raises(ValueError, match="count"):
        SimulatedBackend(-1)


def test_gpu_identity_is_stable() -> None:
    b = SimulatedBackend(3, seed=2)
    infos = [b.gpu_info(i) for i in range(3)]
    assert len({i.uuid for i in infos}) == 3
    assert [i.device for i in infos] == ["nvidia0", "nvidia1", "nvidia2"]
    assert dataclasses.replace(infos[0]) == SimulatedBackend(3, seed=2).gpu_info(0)


@pytest.mark.parametrize("sharing", ["time-slicing", "ack-share"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_shared_gpus_carry_several_pods_within_their_allocation(model: str, sharing: str) -> None:
    snap = SimulatedBackend(2, model=model, sharing=sharing).collect(ALL, T0)
    for g in snap.gpus:
        assert len(g.allocations) == 3 and g.pod is None  # shared: no single holder
        allocated = {a.pod.pod: a.memory_mib for a in g.allocations}
        for p in g.processes:
            assert p.pod is not None and p.used_memory_mib <= allocated[p.pod.pod]
        if sharing == "time-slicing":
            assert set(allocated.values()) == {MODELS[model].memory_total_mib}
        else:  # aliyun.com/gpu-mem units of 1 GiB: 10, 20 and 30 % of the GPU
            assert all(m % 1024 == 0 for m in allocated.values())
            assert sum(allocated.values()) <= MODELS[model].memory_total_mib
        assert sum(p.sm_util for p in g.processes) == pytest.approx(
            g.values["DCGM_FI_DEV_GPU_UTIL"], abs=2
        )


@pytest.mark.parametrize("model", [m for m in sorted(MODELS) if MODELS[m].mig])
def test_mig_gpus_are_cut_into_instances(model: str) -> None:
    snap = SimulatedBackend(2, model=model, sharing="mig").collect(ALL, T0)
    parent, *instances, whole = snap.gpus
    assert parent.info.mig_profile == "" and "DCGM_FI_DEV_GPU_UTIL" not in parent.values
    assert "DCGM_FI_DEV_POWER_USAGE" in parent.values and parent.processes == ()
    assert [i.info.mig_profile for i in instances] == [s.profile for s in MODELS[model].mig]
    for inst in instances:
        assert inst.info.uuid == parent.info.uuid and inst.info.mig_uuid.startswith("MIG-")
        (alloc,) = inst.allocations
        assert alloc.memory_mib == inst.info.memory_total_mib
        assert inst.values["DCGM_FI_DEV_FB_USED"] + inst.values["DCGM_FI_DEV_FB_FREE"] == (
            inst.info.memory_total_mib
        )
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in inst.values  # per instance, as DCGM
        (proc,) = inst.processes
        assert proc.sm_util == round(100 * inst.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
    assert whole.info.index == 1 and whole.info.mig_profile == "" and whole.pod is not None
