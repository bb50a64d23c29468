"""Device ids of every sharing mode -> the containers on each GPU and their memory; the pod
mapper reproduces, from the simulator's kubelet answer alone, what the simulator attaches."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_exporter.allocation import allocations_by_gpu, gpu_key
from gpu_exporter.backend import Allocation, GpuInfo, PodRef, Snapshot
from gpu_exporter.counters import FIELDS
from gpu_exporter.podresources import ContainerDevices, PodResources
from gpu_exporter.process_mapping import PodMapper
from gpu_exporter.simulated import SHARING_MODES, SimulatedBackend

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
GPU_A = GpuInfo(0, A, "p0", "nvidia0", "NVIDIA H100 80GB HBM3", 81559)
GPU_B = GpuInfo(1, B, "p1", "nvidia1", "NVIDIA H100 80GB HBM3", 81559)
MIG_B = dataclasses.replace(
    GPU_B, memory_total_mib=19968, mig_profile="2g.20gb", mig_instance=5, mig_uuid="MIG-b5"
)


def pod(name: str, container: str, resource: str, *ids: str) -> PodResources:
    return PodResources(name, "ml", (ContainerDevices(container, resource, ids),))


def ref(name: str, container: str = "c") -> PodRef:
    return PodRef("ml", name, container)


def test_every_sharing_mode() -> None:
    pods = [
        pod("whole", "c", "nvidia.com/gpu", A),
        pod("ts-0", "c", "nvidia.com/gpu.shared", f"{B}::0"),
        pod("ts-1", "c", "nvidia.com/gpu", f"{B}::3"),
        pod("mig", "c", "nvidia.com/mig-2g.20gb", "MIG-b5"),
        pod("mig-old", "c", "nvidia.com/mig-2g.20gb", f"MIG-{B}/5/0"),
        pod("share", "c", "aliyun.com/gpu-mem", *(f"{A}-_-{n}" for n in range(6))),
        pod("fpga", "c", "example.com/fpga", "fpga0"),
        pod("core", "c", "aliyun.com/gpu-core.percentage", "x"),
        pod("elsewhere", "c", "nvidia.com/gpu", "GPU-not-on-this-node"),
    ]
    table = allocations_by_gpu(pods, [GPU_A, GPU_B, MIG_B], gpu_mem_unit_mib=1024)
    assert table == {
        gpu_key(GPU_A): (Allocation(ref("share"), 6 * 1024), Allocation(ref("whole"), 81559)),
        gpu_key(GPU_B): (Allocation(ref("ts-0"), 81559), Allocation(ref("ts-1"), 81559)),
        gpu_key(MIG_B): (Allocation(ref("mig"), 19968), Allocation(ref("mig-old"), 19968)),
    }


def test_one_container_two_gpus_and_units_add_up() -> None:
    pods = [
        PodResources(
            "p",
            "ml",
            (
                ContainerDevices("c", "nvidia.com/gpu", (A, B)),
                ContainerDevices("d", "aliyun.com/gpu-mem", (f"{A}-_-0",)),
                ContainerDevices("d", "aliyun.com/gpu-mem", (f"{A}-_-1",)),
            ),
        )
    ]
    table = allocations_by_gpu(pods, [GPU_A, GPU_B], gpu_mem_unit_mib=512)
    assert table[gpu_key(GPU_A)] == (
        Allocation(PodRef("ml", "p", "c"), 81559),
        Allocation(PodRef("ml", "p", "d"), 1024),
    )
    assert table[gpu_key(GPU_B)] == (Allocation(PodRef("ml", "p", "c"), 81559),)


@pytest.mark.parametrize("sharing", SHARING_MODES)
def test_mapper_finds_the_simulators_allocations(sharing: str) -> None:
    backend = SimulatedBackend(2, model="A100", seed=3, sharing=sharing)
    snap = backend.collect(frozenset(FIELDS), 1_763_780_000.0)
    bare = Snapshot(
        snap.timestamp,
        snap.driver_version,
        tuple(dataclasses.replace(g, allocations=()) for g in snap.gpus),
    )
    mapped = PodMapper(backend.pod_resources).apply(bare)
    assert [g.allocations for g in mapped.gpus] == [g.allocations for g in snap.gpus]
    assert (
        sum(len(g.allocations) for g in mapped.gpus)
        == {
            "exclusive": 2,
            "time-slicing": 6,
            "mig": 4,  # GPU 0: three MIG instances; GPU 1 whole
            "ack-share": 6,
        }[sharing]
    )
