"""Map GPU processes and GPUs to Kubernetes pods.

- A process's pod comes from ``/proc/<pid>/cgroup``: both the cgroupfs driver's form
  (``/kubepods/burstable/pod<uid>/<container-id>``) and the systemd driver's form
  (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
  cri-containerd-<container-id>.scope``), cgroup v1 and v2, are understood.
- A GPU's pod comes from the kubelet pod-resources API (which container got which device id).
- A pod UID becomes a name through an optional lookup (e.g. the API server); without one, a
  process on a GPU allocated to a single container is attributed to that container.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter.backend import GpuSample, PodRef, ProcessSample, Snapshot

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
    """Fills `GpuSample.pod` and `ProcessSample.pod` of a snapshot."""

    def __init__(
        self,
        allocations: Callable[[], Mapping[str, PodRef]] | None = None,
        *,
        pod_lookup: PodLookup | None = None,
        proc_root: str | Path = "/proc",
    ) -> None:
        self._allocations = allocations
        self._lookup = pod_lookup
        self._proc_root = proc_root

    def apply(self, snapshot: Snapshot) -> Snapshot:
        allocations: Mapping[str, PodRef] = {}
        if self._allocations is not None:
            try:
                allocations = self._allocations()
            except Exception as exc:  # a kubelet hiccup must not fail the collection
                log.warning("pod-resources unavailable error=%s", exc)
        gpus = tuple(self._map_gpu(g, allocations) for g in snapshot.gpus)
        return dataclasses.replace(snapshot, gpus=gpus)

    def _map_gpu(self, gpu: GpuSample, allocations: Mapping[str, PodRef]) -> GpuSample:
        pod = gpu.pod or allocations.get(gpu.info.uuid)
        procs = tuple(self._map_process(p, pod) for p in gpu.processes)
        return dataclasses.replace(gpu, pod=pod, processes=procs)

    def _map_process(self, proc: ProcessSample, gpu_pod: PodRef | None) -> ProcessSample:
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
        if pod is None and gpu_pod is not None and gpu_pod.pod_uid in ("", ref.pod_uid):
            pod = gpu_pod
        if pod is None:
            pod = PodRef("", "", "", ref.pod_uid)
        return dataclasses.replace(proc, pod=dataclasses.replace(pod, pod_uid=ref.pod_uid))
