"""dcgm-exporter text format: golden file, label order, types, MIG, escaping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.backend import (
    Allocation,
    GpuFailure,
    GpuInfo,
    GpuSample,
    PodRef,
    ProcessSample,
    Snapshot,
)
from gpu_exporter.counters import default_counters, parse_counters
from gpu_exporter.exposition import ExpositionOptions, render
from gpu_exporter.simulated import SimulatedBackend

GOLDEN = (
    Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "simulated-2xH100-mixed-seed7.prom"
)
GOLDEN_TIME = 1_763_780_000.0
ALL_FIELDS = frozenset(c.field for c in default_counters())
GPU_LABELS = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
]


def golden_text() -> str:
    backend = SimulatedBackend(2, model="H100", seed=7, load_profile="mixed")
    snap = backend.collect(ALL_FIELDS, GOLDEN_TIME)
    opts = ExpositionOptions(hostname="edge-gpu-1", kubernetes=True)
    return render(snap, default_counters(), opts)


def test_golden_file_line_by_line() -> None:
    text = golden_text()
    if os.environ.get("RAVEN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text().splitlines()
    got = text.splitlines()
    for n, (e, g) in enumerate(zip(expected, got, strict=False), start=1):
        assert g == e, f"line {n} differs"
    assert len(got) == len(expected)


def label_names(line: str) -> list[str]:
    inner = line[line.index("{") + 1 : line.rindex("}")]
    names = []
    for part in inner.split('",'):
        names.append(part.split("=", 1)[0])
    return names


def test_label_order_is_dcgm_exporters() -> None:
    base = [x for x in GPU_LABELS if x != "DCGM_FI_DRIVER_VERSION"]
    for line in golden_text().splitlines():
        if line.startswith("DCGM_FI_DEV_XID_ERRORS{"):
            pod = ["container", "namespace", "pod"]
            assert label_names(line) == [*GPU_LABELS, *pod, "err_code", "err_msg"], line
        elif line.startswith("DCGM_FI_"):
            assert label_names(line) == [*GPU_LABELS, "container", "namespace", "pod"], line
        elif line.startswith("DCGM_CUSTOM_"):
            assert label_names(line) == [*base, "container", "namespace", "pod"], line


def test_ack_label_mode() -> None:
    backend = SimulatedBackend(1, seed=7, load_profile="training")
    opts = ExpositionOptions(hostname="edge-gpu-1", kubernetes=True, label_mode="ack")
    text = render(backend.collect(ALL_FIELDS, GOLDEN_TIME), default_counters(), opts)
    base = [x for x in GPU_LABELS if x != "DCGM_FI_DRIVER_VERSION"]
    ack = ["NamespaceName", "PodName", "ContainerName", "NodeName"]
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_TEMP{"):
            assert label_names(line) == [
                *base, "NodeName", "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"
            ]  # fmt: skip
        elif line.startswith("DCGM_CUSTOM_"):
            assert label_names(line) == [*base, *ack], line
            assert 'PodName="train-7-0",ContainerName="trainer",NodeName="edge-gpu-1"' in line
    with pytest.raises(ValueError, match="label mode"):
        ExpositionOptions(label_mode="dcgm")


def test_per_container_by_default_per_process_opt_in() -> None:
    pod_a, pod_b = PodRef("ml", "a", "c"), PodRef("ml", "b", "c")
    procs = (
        ProcessSample(1, 100, 10, 5, pod=pod_a),
        ProcessSample(2, 200, 20, 6, pod=pod_a),
        ProcessSample(3, 300, 30, 7, pod=pod_b),
        ProcessSample(4, 400, 40, 8),  # a host process: in no pod
    )
    info = GpuInfo(0, "GPU-a", "p", "nvidia0", "m", 1000)
    allocs = (Allocation(pod_a, 250), Allocation(pod_b, 500))
    snap = Snapshot(0.0, "1", (GpuSample(info, {}, procs, allocs),))
    fams = {
        f.name: f
        for f in text_string_to_metric_families(
            render(snap, default_counters(), ExpositionOptions(hostname="h"))
        )
    }
    used = {s.labels["pod"]: s.value for s in fams["DCGM_CUSTOM_PROCESS_MEM_USED"].samples}
    assert used == {"a": 300, "b": 300}  # summed per container; the host process left out
    sm = {s.labels["pod"]: s.value for s in fams["DCGM_CUSTOM_PROCESS_SM_UTIL"].samples}
    assert sm == {"a": 30, "b": 30}
    alloc = {s.labels["pod"]: s.value for s in fams["DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED"].samples}
    assert alloc == {"a": 250, "b": 500}  # from each container's allocation
    assert all("pid" not in s.labels for s in fams["DCGM_CUSTOM_PROCESS_MEM_USED"].samples)
    per_process = render(snap, default_counters(), ExpositionOptions(per_process=True))
    lines = [x for x in per_process.splitlines() if x.startswith("DCGM_CUSTOM_PROCESS_MEM_USED{")]
    assert [x.split('pid="')[1].split('"')[0] for x in lines] == ["1", "2", "3", "4"]


def test_xid_carries_code_and_message() -> None:
    info = GpuInfo(0, "GPU-a", "p", "nvidia0", "m")
    snap = Snapshot(0.0, "1", (GpuSample(info, {"DCGM_FI_DEV_XID_ERRORS": 79}),))
    text = render(snap, default_counters(), ExpositionOptions())
    assert 'err_code="79",err_msg="GPU has fallen off the bus"} 79' in text


def test_parses_as_prometheus_text_with_dcgm_types() -> None:
    families = {f.name: f for f in text_string_to_metric_families(golden_text())}
    # Counters keep their bare names: the exposition has no _total suffix.
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in golden_text()
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert families["DCGM_FI_DEV_GPU_TEMP"].documentation == "GPU temperature (in C)."
    assert families["DCGM_FI_DEV_POWER_USAGE"].documentation == "Power draw (in W)."
    assert families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].type == "gauge"
    custom = families["DCGM_CUSTOM_PROCESS_SM_UTIL"]
    pods = {s.labels["pod"] for s in custom.samples}
    assert "train-7-0" in pods
    assert all(s.labels["Hostname"] == "edge-gpu-1" for s in custom.samples)
    alloc = families["DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED"]
    assert {s.value for s in alloc.samples} == {81559.0}


def test_value_formats() -> None:
    text = golden_text()
    power = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    assert power.rsplit(" ", 1)[1].count(".") == 1 and len(power.rsplit(".", 1)[1]) == 6
    temp = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    assert temp.rsplit(" ", 1)[1].isdigit()


def sample_snapshot(mig_profile: str = "", mig_instance: int | None = None) -> Snapshot:
    info = GpuInfo(
        0,
        "GPU-a",
        "00000000:18:00.0",
        "nvidia0",
        "NVIDIA A100-SXM4-40GB",
        40960,
        mig_profile=mig_profile,
        mig_instance=mig_instance,
    )
    pod = PodRef("team-a", "job-1", "main")
    gpu = GpuSample(
        info,
        {"DCGM_FI_DEV_GPU_TEMP": 50, "DCGM_FI_DEV_FB_USED": 1024},
        (ProcessSample(9, 1000, 30, pod=pod),),
        (Allocation(pod, 40960),),
    )
    return Snapshot(0.0, "535.1", (gpu,))


def test_hostname_label_option_and_no_pod_labels_without_kubernetes() -> None:
    text = render(
        sample_snapshot(),
        default_counters(),
        ExpositionOptions(hostname="n1", hostname_label="hostname"),
    )
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    assert line == (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        'modelName="NVIDIA A100-SXM4-40GB",hostname="n1",DCGM_FI_DRIVER_VERSION="535.1"} 50'
    )
    with pytest.raises(ValueError):
        ExpositionOptions(hostname_label="host")


def test_mig_labels_follow_model_name() -> None:
    snap = sample_snapshot(mig_profile="1g.5gb", mig_instance=3)
    text = render(snap, default_counters(), ExpositionOptions(hostname="n1", kubernetes=True))
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_FB_USED{"))
    assert label_names(line) == [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "GPU_I_PROFILE",
        "GPU_I_ID",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "namespace",
        "pod",
    ]
    assert 'GPU_I_PROFILE="1g.5gb",GPU_I_ID="3"' in line


LABELS = (
    'gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",'
    'modelName="NVIDIA A100-SXM4-40GB"'
)


def test_counters_file_selects_and_orders_metrics() -> None:
    counters = parse_counters(
        "DCGM_FI_DEV_FB_USED, gauge, used\nDCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
    )
    text = render(sample_snapshot(), counters, ExpositionOptions(custom_metrics=False))
    assert text.splitlines() == [
        "# HELP DCGM_FI_DEV_FB_USED used",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        f"DCGM_FI_DEV_FB_USED{{{LABELS}}} 1024",
        "# HELP DCGM_FI_DEV_GPU_TEMP temp",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 50",
    ]


def test_failed_gpu_has_no_series_and_missing_fields_no_header() -> None:
    snap = sample_snapshot()
    lost = GpuFailure(GpuInfo(1, "GPU-b", "x", "nvidia1", "m"), "GPU is lost")
    snap = Snapshot(0.0, "535.1", snap.gpus, (lost,))
    text = render(snap, default_counters(), ExpositionOptions())
    assert "GPU-b" not in text
    assert "DCGM_FI_DEV_POWER_USAGE" not in text  # no value, no HELP/TYPE either


def test_label_values_are_escaped() -> None:
    info = GpuInfo(0, 'GPU-"q"', "b\\s", "nvidia0", "line\nbreak")
    snap = Snapshot(0.0, "1", (GpuSample(info, {"DCGM_FI_DEV_GPU_TEMP": 1}),))
    text = render(snap, default_counters(), ExpositionOptions())
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_TEMP"
    ]
    labels = family.samples[0].labels
    assert (labels["UUID"], labels["pci_bus_id"], labels["modelName"]) == (
        'GPU-"q"',
        "b\\s",
        "line\nbreak",
    )


def test_unmapped_process_keeps_empty_pod_labels_per_process() -> None:
    info = GpuInfo(0, "GPU-a", "p", "nvidia0", "m", 100)
    snap = Snapshot(0.0, "1", (GpuSample(info, {}, (ProcessSample(5, 10, 1),)),))
    opts = ExpositionOptions(hostname="h", per_process=True, label_mode="ack")
    text = render(snap, default_counters(), opts)
    line = next(x for x in text.splitlines() if x.startswith("DCGM_CUSTOM_PROCESS_MEM_USED{"))
    assert line.endswith('pid="5",NamespaceName="",PodName="",ContainerName="",NodeName="h"} 10')
    assert "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED" not in text
    per_container = render(snap, default_counters(), ExpositionOptions(hostname="h"))
    assert "DCGM_CUSTOM_PROCESS_MEM_USED" not in per_container
