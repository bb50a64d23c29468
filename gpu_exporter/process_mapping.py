"""Map GPU processes and GPUs to Kubernetes pods.

- A process's pod comes from ``/proc/<pid>/cgroup``: both the cgroupfs driver's form
  (``/kubepods/burstable/pod<uid>/<container-id>``) and the systemd driver's form
  (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
  cri-containerd-<container-id>.scope``), cgroup v1 and v2, are understood.
- A GPU's containers come from the kubelet pod-resources API (which container got which device
  id; see `gpu_exporter.allocation` for the sharing modes).
- A pod UID becomes a name through a lookup (the API server, `gpu_exporter.kube_pods`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter.allocation import DEFAULT_GPU_MEM_UNIT_MIB, allocations_by_gpu, gpu_key
from gpu_exporter.backend import Allocation, GpuSample, PodRef, ProcessSample, Snapshot
from gpu_exporter.podresources import PodResources

__all__ = [
    "MAX_CGROUP_FILE_BYTES",
    "CgroupRef",
    "PodMapper",
    "parse_cgroup",
    "read_process_cgroup",
]

log = logging.getLogger(__name__)

MAX_CGROUP_FILE_BYTES = 64 * 1024
"""Read at most this much of /proc/<pid>/cgroup (bytes)."""

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD_RE = re.compile(r"pod(" + _UID + r")(?:\.slice)?(?:/|$)")
_CONTAINER_RE = re.compile(
    r"^(?:(?:cri-containerd|containerd|docker|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True, slots=True)
class CgroupRef:
    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod UID and container id named in a /proc/<pid>/cgroup file, or None."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        if "kubepods" not in path:
            continue
        pod = _POD_RE.search(path)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-").lower()
        rest = path[pod.end() :].strip("/")
        container = ""
        for component in reversed(rest.split("/")) if rest else ():
            match = _CONTAINER_RE.match(component)
            if match:
                container = match.group(1)
                break
        return CgroupRef(uid, container)
    return None


def read_process_cgroup(pid: int, proc_root: str | Path = "/proc") -> CgroupRef | None:
    """Parse /proc/<pid>/cgroup; None when the process is gone or not in a pod."""
    try:
        with (Path(proc_root) / str(int(pid)) / "cgroup").open("rb") as f:
            data = f.read(MAX_CGROUP_FILE_BYTES)
    except OSError:
        return None
    return parse_cgroup(data.decode("utf-8", "replace"))


PodLookup = Callable[[CgroupRef], PodRef | None]
"""(pod UID, container id) -> pod (e.g. `gpu_exporter.kube_pods.ApiServerPodLookup`)."""


class PodMapper:
    """Fills `GpuSample.allocations` and `ProcessSample.pod` of a snapshot.

    A GPU's containers come from the kubelet (`allocations_by_gpu`: exclusive, time-sliced,
    MIG, ACK shared). A process's pod comes from its own cgroup (pod UID and container id),
    named through ``pod_lookup``. A process outside any pod cgroup (a host tool, a daemon) is
    never attributed. Only where no lookup is configured at all is a process in a pod taken to
    be the GPU's container, and only when exactly one container holds that GPU.
    """

    def __init__(
        self,
        pod_resources: Callable[[], Sequence[PodResources]] | None = None,
        *,
        pod_lookup: PodLookup | None = None,
        proc_root: str | Path = "/proc",
        gpu_mem_unit_mib: int = DEFAULT_GPU_MEM_UNIT_MIB,
    ) -> None:
        self._pod_resources = pod_resources
        self._lookup = pod_lookup
        self._proc_root = proc_root
        self._unit = gpu_mem_unit_mib
        self._last_error = ""

    def _kubelet(self) -> Sequence[PodResources]:
        if self._pod_resources is None:
            return ()
        try:
            pods = self._pod_resources()
        except Exception as exc:  # a kubelet hiccup must not fail the collection
            if str(exc) != self._last_error:
                log.warning("pod-resources unavailable error=%s", exc)
            self._last_error = str(exc)
            return ()
        self._last_error = ""
        return pods

    def apply(self, snapshot: Snapshot) -> Snapshot:
        table = allocations_by_gpu(
            self._kubelet(), (g.info for g in snapshot.gpus), gpu_mem_unit_mib=self._unit
        )
        gpus = tuple(
            self._map_gpu(g, table.get(gpu_key(g.info), g.allocations)) for g in snapshot.gpus
        )
        return dataclasses.replace(snapshot, gpus=gpus)

    def _map_gpu(self, gpu: GpuSample, allocations: tuple[Allocation, ...]) -> GpuSample:
        holders = {a.pod for a in allocations}
        only = next(iter(holders)) if len(holders) == 1 else None
        procs = tuple(self._map_process(p, only) for p in gpu.processes)
        return dataclasses.replace(gpu, allocations=allocations, processes=procs)

    def _map_process(self, proc: ProcessSample, only_holder: PodRef | None) -> ProcessSample:
        if proc.pod is not None:
            return proc
        ref = read_process_cgroup(proc.pid, self._proc_root)
        if ref is None:
            return proc
        pod: PodRef | None = None
        if self._lookup is not None:
            try:
                pod = self._lookup(ref)
            except Exception as exc:
                log.warning("pod lookup failed uid=%s error=%s", ref.pod_uid, exc)
        elif only_holder is not None and only_holder.pod_uid in ("", ref.pod_uid):
            pod = only_holder
        if pod is None:
            pod = PodRef("", "", "", ref.pod_uid)
        return dataclasses.replace(proc, pod=dataclasses.replace(pod, pod_uid=ref.pod_uid))
