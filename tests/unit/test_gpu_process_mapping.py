"""/proc/<pid>/cgroup parsing (cgroupfs and systemd drivers) and the pod mapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.backend import Allocation, GpuInfo, GpuSample, PodRef, ProcessSample, Snapshot
from gpu_exporter.podresources import ContainerDevices, PodResources
from gpu_exporter.process_mapping import CgroupRef, PodMapper, parse_cgroup, read_process_cgroup

UID = "6a0f1b2c-3d4e-4f50-8a9b-0c1d2e3f4a5b"
SYSTEMD_UID = UID.replace("-", "_")
CID = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, cgroupfs driver
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu:/kubepods/burstable/pod{UID}/{CID}\n",
        f"4:devices:/kubepods/pod{UID}/{CID}\n",
        # cgroup v1, systemd driver, containerd
        "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        # cgroup v2, systemd driver, docker / cri-o
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
        # cgroup v2, cgroupfs driver, nested in a kind/system container
        f"0::/system.slice/containerd.service/kubepods/besteffort/pod{UID}/{CID}\n",
    ],
)
def test_cgroup_forms(text: str) -> None:
    assert parse_cgroup(text) == CgroupRef(UID, CID)


def test_pod_level_cgroup_without_container() -> None:
    assert parse_cgroup(f"0::/kubepods/besteffort/pod{UID}\n") == CgroupRef(UID, "")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/user.slice/user-1000.slice/session-1.scope\n",
        "garbage\n",
        "0::/kubepods/besteffort/podnotauid/x\n",
        "\x00\xff::",
    ],
)
def test_not_in_a_pod(text: str) -> None:
    assert parse_cgroup(text) is None


def write_proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_read_process_cgroup(tmp_path: Path) -> None:
    write_proc(tmp_path, 42, f"0::/kubepods/pod{UID}/{CID}\n")
    assert read_process_cgroup(42, tmp_path) == CgroupRef(UID, CID)
    assert read_process_cgroup(43, tmp_path) is None  # process gone


A_UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B_UUID = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
OTHER_UID = "11111111-2222-3333-4444-555555555555"


def kubelet(*pods: tuple[str, str, str]) -> list[PodResources]:
    """(pod name, resource, device id) -> a pod-resources answer, namespace ns, container c."""
    return [
        PodResources(name, "ns", (ContainerDevices("c", resource, (dev,)),))
        for name, resource, dev in pods
    ]


def two_gpus() -> Snapshot:
    gpu_a = GpuSample(
        GpuInfo(0, A_UUID, "p", "nvidia0", "m", 80), {}, (ProcessSample(1, 5), ProcessSample(3, 5))
    )
    gpu_b = GpuSample(GpuInfo(1, B_UUID, "p", "nvidia1", "m", 80), {}, (ProcessSample(2, 5),))
    return Snapshot(0.0, "1", (gpu_a, gpu_b))


def test_processes_named_through_their_own_cgroup(tmp_path: Path) -> None:
    write_proc(tmp_path, 1, f"0::/kubepods/pod{UID}/{CID}\n")
    write_proc(tmp_path, 2, f"0::/kubepods/pod{OTHER_UID}/{CID}\n")
    lookups: list[str] = []

    def lookup(ref: CgroupRef) -> PodRef | None:
        lookups.append(ref.pod_uid)
        return PodRef("other-ns", "shared-pod", "c") if ref.pod_uid == OTHER_UID else None

    pods = kubelet(("trainer-0", "nvidia.com/gpu", A_UUID))
    snap = PodMapper(lambda: pods, pod_lookup=lookup, proc_root=tmp_path).apply(two_gpus())
    a, b = snap.gpus
    assert a.pod == PodRef("ns", "trainer-0", "c") and b.pod is None
    assert a.allocations == (Allocation(PodRef("ns", "trainer-0", "c"), 80),)
    # pid 1: in a pod the API server does not know: named by UID only, never "the holder"
    assert a.processes[0].pod == PodRef("", "", "", UID)
    # pid 3: no cgroup file (a host process): unmapped
    assert a.processes[1].pod is None
    # pid 2: on a GPU nobody was given, named by its own cgroup's pod
    assert b.processes[0].pod == PodRef("other-ns", "shared-pod", "c", OTHER_UID)
    assert sorted(lookups) == sorted([UID, OTHER_UID])


def test_without_api_access_only_a_single_holder_is_assumed(tmp_path: Path) -> None:
    write_proc(tmp_path, 1, f"0::/kubepods/pod{UID}/{CID}\n")
    write_proc(tmp_path, 2, f"0::/kubepods/pod{OTHER_UID}/{CID}\n")
    pods = kubelet(
        ("trainer-0", "nvidia.com/gpu", A_UUID),
        ("ts-0", "nvidia.com/gpu", f"{B_UUID}::0"),
        ("ts-1", "nvidia.com/gpu", f"{B_UUID}::1"),
    )
    snap = PodMapper(lambda: pods, proc_root=tmp_path).apply(two_gpus())
    a, b = snap.gpus
    assert a.processes[0].pod == PodRef("ns", "trainer-0", "c", UID)
    assert a.processes[1].pod is None  # host process
    assert len(b.allocations) == 2 and b.pod is None
    assert b.processes[0].pod == PodRef("", "", "", OTHER_UID)  # two holders: not guessed


def test_mapper_survives_failing_kubelet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> list[PodResources]:
        raise OSError("connection refused")

    gpu = GpuSample(GpuInfo(0, A_UUID, "p", "nvidia0", "m"), {"DCGM_FI_DEV_GPU_TEMP": 1})
    mapper = PodMapper(broken, proc_root=tmp_path)
    for _ in range(3):
        snap = mapper.apply(Snapshot(0.0, "1", (gpu,)))
    assert snap.gpus[0].values == {"DCGM_FI_DEV_GPU_TEMP": 1}
    assert snap.gpus[0].pod is None
    assert len([r for r in caplog.records if "pod-resources unavailable" in r.message]) == 1
