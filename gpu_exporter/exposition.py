"""Render a Snapshot in dcgm-exporter's text format.

dcgm-exporter's shape, which dashboards and adapter rules depend on:

- one ``# HELP`` / ``# TYPE`` pair per metric, then its series; counters keep their bare DCGM
  names (no ``_total``);
- labels in the order ``gpu, UUID, pci_bus_id, device, modelName`` (MIG instances add
  ``GPU_I_PROFILE, GPU_I_ID`` here), ``Hostname`` (or ``hostname``), then the ``label``-type
  counters (``DCGM_FI_DRIVER_VERSION``), then ``container, namespace, pod`` when the GPU is mapped
  to a pod;
- integers are written as integers, doubles with six decimals.

ACK-style custom metrics follow: per process (``DCGM_CUSTOM_PROCESS_*``, with ``pid``) and per
container (``DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED``), labelled with the GPU labels plus
``NamespaceName, PodName, ContainerName, NodeName``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_exporter.backend import GpuInfo, GpuSample, PodRef, ProcessSample, Snapshot
from gpu_exporter.counters import CUSTOM_METRICS, FIELDS, Counter, MetricType, ValueKind

__all__ = ["HOSTNAME_LABELS", "ExpositionOptions", "escape_label_value", "render"]

HOSTNAME_LABELS = ("Hostname", "hostname")


@dataclass(frozen=True, slots=True)
class ExpositionOptions:
    hostname: str = ""
    """Value of the Hostname label; empty leaves the label out (as dcgm-exporter does)."""
    hostname_label: str = "Hostname"
    """``Hostname`` (released dcgm-exporter versions) or ``hostname``."""
    kubernetes: bool = False
    """Add ``container, namespace, pod`` to device series of GPUs allocated to a pod."""
    node_name: str = ""
    """Value of NodeName on custom metrics; defaults to the hostname."""
    custom_metrics: bool = True
    """Emit the DCGM_CUSTOM_* per-process and per-container metrics."""

    def __post_init__(self) -> None:
        if self.hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname label must be one of {', '.join(HOSTNAME_LABELS)}")


def escape_label_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _format(value: float, kind: ValueKind) -> str:
    if kind is ValueKind.INT:
        return str(int(value))
    return f"{value:f}"


def _gpu_labels(info: GpuInfo, opts: ExpositionOptions, label_values: str) -> str:
    e = escape_label_value
    parts = [
        f'gpu="{info.index}",UUID="{e(info.uuid)}",pci_bus_id="{e(info.pci_bus_id)}",'
        f'device="{e(info.device)}",modelName="{e(info.model_name)}"'
    ]
    if info.mig_profile:
        instance = "" if info.mig_instance is None else str(info.mig_instance)
        parts.append(f',GPU_I_PROFILE="{e(info.mig_profile)}",GPU_I_ID="{instance}"')
    if opts.hostname:
        parts.append(f',{opts.hostname_label}="{e(opts.hostname)}"')
    parts.append(label_values)
    return "".join(parts)


def _pod_labels(pod: PodRef | None) -> str:
    if pod is None:
        return ""
    e = escape_label_value
    return f',container="{e(pod.container)}",namespace="{e(pod.namespace)}",pod="{e(pod.pod)}"'


def _custom_pod_labels(pod: PodRef | None, node_name: str) -> str:
    e = escape_label_value
    if pod is None:
        return f',NamespaceName="",PodName="",ContainerName="",NodeName="{e(node_name)}"'
    return (
        f',NamespaceName="{e(pod.namespace)}",PodName="{e(pod.pod)}",'
        f'ContainerName="{e(pod.container)}",NodeName="{e(node_name)}"'
    )


def _process_value(name: str, proc: ProcessSample) -> int:
    if name == "DCGM_CUSTOM_PROCESS_SM_UTIL":
        return proc.sm_util
    if name == "DCGM_CUSTOM_PROCESS_MEM_COPY_UTIL":
        return proc.mem_util
    if name == "DCGM_CUSTOM_PROCESS_ENCODE_UTIL":
        return proc.enc_util
    if name == "DCGM_CUSTOM_PROCESS_DECODE_UTIL":
        return proc.dec_util
    return proc.used_memory_mib


def render(snapshot: Snapshot, counters: Sequence[Counter], opts: ExpositionOptions) -> str:
    """The dcgm-exporter text exposition of one snapshot (failed GPUs have no series)."""
    label_counters = [c for c in counters if c.type is MetricType.LABEL]
    label_values = "".join(
        f',{c.field}="{escape_label_value(snapshot.driver_version)}"'
        for c in label_counters
        if c.field == "DCGM_FI_DRIVER_VERSION"
    )
    gpus = snapshot.gpus
    base = [_gpu_labels(g.info, opts, label_values) for g in gpus]
    device = [
        b + _pod_labels(g.pod) if opts.kubernetes else b for b, g in zip(base, gpus, strict=True)
    ]
    out: list[str] = []
    for c in counters:
        if c.type is MetricType.LABEL:
            continue
        kind = FIELDS[c.field].kind
        lines = [
            f"{c.field}{{{labels}}} {_format(g.values[c.field], kind)}\n"
            for g, labels in zip(gpus, device, strict=True)
            if c.field in g.values
        ]
        if lines:
            out.append(f"# HELP {c.field} {c.help}\n# TYPE {c.field} {c.type.value}\n")
            out.extend(lines)
    if opts.custom_metrics:
        _render_custom(out, gpus, base, opts)
    return "".join(out)


def _render_custom(
    out: list[str], gpus: Sequence[GpuSample], base: Sequence[str], opts: ExpositionOptions
) -> None:
    node = escape_label_value(opts.node_name or opts.hostname)
    per_proc = [
        [f',pid="{p.pid}"{_custom_pod_labels(p.pod, node)}' for p in g.processes] for g in gpus
    ]
    for metric in CUSTOM_METRICS:
        name = metric.name
        if name == "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED":
            lines = [
                f"{name}{{{b}{_custom_pod_labels(g.pod, node)}}} {g.info.memory_total_mib}\n"
                for g, b in zip(gpus, base, strict=True)
                if g.pod is not None
            ]
        else:
            lines = [
                f"{name}{{{b}{suffix}}} {_process_value(name, p)}\n"
                for g, b, suffixes in zip(gpus, base, per_proc, strict=True)
                for p, suffix in zip(g.processes, suffixes, strict=True)
            ]
        if lines:
            out.append(f"# HELP {name} {metric.help}\n# TYPE {name} gauge\n")
            out.extend(lines)
