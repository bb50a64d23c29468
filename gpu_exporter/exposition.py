"""Render a Snapshot in dcgm-exporter's text format.

dcgm-exporter's shape, which dashboards and adapter rules depend on:

- one ``# HELP`` / ``# TYPE`` pair per metric, then its series; counters keep their bare DCGM
  names (no ``_total``);
- labels in the order ``gpu, UUID, pci_bus_id, device, modelName`` (MIG instances add
  ``GPU_I_PROFILE, GPU_I_ID`` here), ``Hostname`` (or ``hostname``), in ACK label mode
  ``NodeName``, then the ``label``-type counters (``DCGM_FI_DRIVER_VERSION``), then
  ``container, namespace, pod`` when one container holds the GPU; ``DCGM_FI_DEV_XID_ERRORS``
  adds ``err_code, err_msg``;
- integers are written as integers, doubles with six decimals.

Per-container metrics follow (``DCGM_CUSTOM_PROCESS_*``: the sum over a container's processes on
a GPU; ``DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED``: what the container was given of that GPU). They
carry the GPU labels plus the pod labels of the label mode: ``container, namespace, pod``
(upstream) or ``NamespaceName, PodName, ContainerName, NodeName`` (ACK). With ``per_process``
there is one series per process instead, with a ``pid`` label (and processes outside any pod).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_exporter.backend import GpuInfo, GpuSample, PodRef, ProcessSample, Snapshot
from gpu_exporter.counters import CUSTOM_METRICS, FIELDS, Counter, MetricType, ValueKind
from gpu_exporter.xid import xid_description

__all__ = ["HOSTNAME_LABELS", "LABEL_MODES", "ExpositionOptions", "escape_label_value", "render"]

HOSTNAME_LABELS = ("Hostname", "hostname")
LABEL_MODES = ("upstream", "ack")
"""upstream: dcgm-exporter's labels; ack: ACK GPU monitoring's (NodeName, NamespaceName...)."""


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
    """Emit the DCGM_CUSTOM_* per-container metrics."""
    label_mode: str = "upstream"
    """``upstream`` or ``ack`` (see LABEL_MODES)."""
    per_process: bool = False
    """One DCGM_CUSTOM_PROCESS_* series per process (``pid`` label) instead of per container."""

    def __post_init__(self) -> None:
        if self.hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname label must be one of {', '.join(HOSTNAME_LABELS)}")
        if self.label_mode not in LABEL_MODES:
            raise ValueError(f"label mode must be one of {', '.join(LABEL_MODES)}")

    @property
    def node(self) -> str:
        return self.node_name or self.hostname


def escape_label_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _format(value: float, kind: ValueKind) -> str:
    if kind is ValueKind.INT:
        return str(int(value))
    return f"{value:f}"


def _gpu_labels(info: GpuInfo, opts: ExpositionOptions) -> str:
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
    return "".join(parts)


def _device_labels(gpu: GpuSample, opts: ExpositionOptions, base: str, label_values: str) -> str:
    parts = [base]
    if opts.label_mode == "ack":
        parts.append(f',NodeName="{escape_label_value(opts.node)}"')
    parts.append(label_values)
    pod = gpu.pod
    if opts.kubernetes and pod is not None:
        e = escape_label_value
        parts.append(
            f',container="{e(pod.container)}",namespace="{e(pod.namespace)}",pod="{e(pod.pod)}"'
        )
    return "".join(parts)


def _custom_pod_labels(pod: PodRef | None, opts: ExpositionOptions) -> str:
    e = escape_label_value
    ns, name, container = ("", "", "") if pod is None else (pod.namespace, pod.pod, pod.container)
    if opts.label_mode == "ack":
        return (
            f',NamespaceName="{e(ns)}",PodName="{e(name)}",ContainerName="{e(container)}",'
            f'NodeName="{e(opts.node)}"'
        )
    return f',container="{e(container)}",namespace="{e(ns)}",pod="{e(name)}"'


_USAGE_METRICS = (
    "DCGM_CUSTOM_PROCESS_SM_UTIL",
    "DCGM_CUSTOM_PROCESS_MEM_COPY_UTIL",
    "DCGM_CUSTOM_PROCESS_ENCODE_UTIL",
    "DCGM_CUSTOM_PROCESS_DECODE_UTIL",
    "DCGM_CUSTOM_PROCESS_MEM_USED",
)
"""The DCGM_CUSTOM_PROCESS_* metrics, in the order of a usage tuple."""

Usage = tuple[int, int, int, int, int]


def _usage(p: ProcessSample) -> Usage:
    return (p.sm_util, p.mem_util, p.enc_util, p.dec_util, p.used_memory_mib)


def _usage_rows(gpu: GpuSample, opts: ExpositionOptions) -> list[tuple[str, Usage]]:
    """(label suffix, usage): per container by default, per process with per_process."""
    if opts.per_process:
        return [
            (f',pid="{p.pid}"' + _custom_pod_labels(p.pod, opts), _usage(p)) for p in gpu.processes
        ]
    by_pod: dict[tuple[str, str, str], list[int]] = {}
    refs: dict[tuple[str, str, str], PodRef] = {}
    for p in gpu.processes:
        if p.pod is None or not p.pod.pod:
            continue  # outside any pod, or a pod nobody could name
        key = (p.pod.namespace, p.pod.pod, p.pod.container)
        refs.setdefault(key, p.pod)
        total = by_pod.setdefault(key, [0, 0, 0, 0, 0])
        for i, v in enumerate(_usage(p)):
            total[i] += v
    return [
        (_custom_pod_labels(refs[k], opts), (t[0], t[1], t[2], t[3], t[4]))
        for k, t in sorted(by_pod.items())
    ]


def render(snapshot: Snapshot, counters: Sequence[Counter], opts: ExpositionOptions) -> str:
    """The dcgm-exporter text exposition of one snapshot (failed GPUs have no series)."""
    label_values = "".join(
        f',{c.metric}="{escape_label_value(snapshot.driver_version)}"'
        for c in counters
        if c.type is MetricType.LABEL and c.field == "DCGM_FI_DRIVER_VERSION"
    )
    gpus = snapshot.gpus
    base = [_gpu_labels(g.info, opts) for g in gpus]
    device = [_device_labels(g, opts, b, label_values) for g, b in zip(gpus, base, strict=True)]
    out: list[str] = []
    for c in counters:
        if c.type is MetricType.LABEL:
            continue
        kind = FIELDS[c.field].kind
        lines = [
            f"{c.metric}{{{labels}{_xid_labels(c.field, g.values[c.field])}}} "
            f"{_format(g.values[c.field], kind)}\n"
            for g, labels in zip(gpus, device, strict=True)
            if c.field in g.values
        ]
        if lines:
            out.append(f"# HELP {c.metric} {c.help}\n# TYPE {c.metric} {c.type.value}\n")
            out.extend(lines)
    if opts.custom_metrics:
        _render_custom(out, gpus, base, opts)
    return "".join(out)


def _xid_labels(field: str, value: float) -> str:
    if field != "DCGM_FI_DEV_XID_ERRORS":
        return ""
    code = int(value)
    return f',err_code="{code}",err_msg="{escape_label_value(xid_description(code))}"'


def _render_custom(
    out: list[str], gpus: Sequence[GpuSample], base: Sequence[str], opts: ExpositionOptions
) -> None:
    rows = [_usage_rows(g, opts) for g in gpus]
    for metric in CUSTOM_METRICS:
        name = metric.name
        if name == "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED":
            lines = [
                f"{name}{{{b}{_custom_pod_labels(a.pod, opts)}}} {a.memory_mib}\n"
                for g, b in zip(gpus, base, strict=True)
                for a in g.allocations
            ]
        else:
            i = _USAGE_METRICS.index(name)
            lines = [
                f"{name}{{{b}{suffix}}} {usage[i]}\n"
                for b, gpu_rows in zip(base, rows, strict=True)
                for suffix, usage in gpu_rows
            ]
        if lines:
            out.append(f"# HELP {name} {metric.help}\n# TYPE {name} gauge\n")
            out.extend(lines)
