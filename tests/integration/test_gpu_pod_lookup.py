"""The GPU exporter names pods from the API server through raven.kube's client (the one
Kubernetes client of every component): this node's pods only, cached, refreshed early for an
unknown pod, the old table kept while the API server fails, its garbage skipped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_exporter.backend import PodRef
from gpu_exporter.kube_pods import ApiServerPodLookup, pod_list_fetcher
from gpu_exporter.process_mapping import CgroupRef
from raven.kube.client import ApiConfig
from tests.helpers.fakekube import FakeKube

pytestmark = pytest.mark.integration

UID = "6a0f1b2c-3d4e-4f50-8a9b-0c1d2e3f4a5b"
CID = "0123456789abcdef" * 4
NEW_UID = "99999999-2222-3333-4444-555555555555"


def pod(uid: str, ns: str, name: str, node: str, containers: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"uid": uid, "namespace": ns, "name": name},
        "spec": {"nodeName": node},
        "status": {"containerStatuses": [
            {"name": n, "containerID": f"containerd://{cid}"} for cid, n in containers.items()
        ]},
    }  # fmt: skip


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    """Served from its own thread: the lookup is called from a thread with no event loop, as
    the exporter's collection thread calls it."""
    with FakeKube(bookmark_interval_s=3600) as kube:
        yield kube


def call(fn: Any) -> Any:
    """``fn()`` from a plain thread (the collection thread has no event loop)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(30)
    return out[0]


def test_names_this_nodes_pods_and_refreshes_for_a_new_one(kube: FakeKube) -> None:
    kube.put("pods", pod(UID, "ml", "trainer-0", "edge-gpu-1", {CID: "main", "f" * 64: "side"}),
             "ml")  # fmt: skip
    kube.put("pods", pod("other-uid", "ml", "elsewhere", "edge-gpu-2", {}), "ml")
    now = [0.0]
    lookup = ApiServerPodLookup(pod_list_fetcher(ApiConfig(kube.url)), "edge-gpu-1", ttl_s=30,
                                min_refresh_s=5, clock=lambda: now[0])  # fmt: skip
    assert call(lambda: lookup(CgroupRef(UID, CID))) == PodRef("ml", "trainer-0", "main", UID)
    assert call(lambda: lookup(CgroupRef(UID, "0" * 64))) == PodRef("ml", "trainer-0", "", UID)
    assert call(lambda: lookup(CgroupRef("other-uid", CID))) is None  # another node's pod
    lists = kube.list_requests("/api/v1/pods")
    assert [q.get("fieldSelector") for q in lists] == ["spec.nodeName=edge-gpu-1"]  # cached
    assert call(lambda: lookup(CgroupRef(NEW_UID, CID))) is None  # unknown, refreshed < 5 s ago
    kube.put("pods", pod(NEW_UID, "ml", "trainer-1", "edge-gpu-1", {}), "ml")
    now[0] = 6.0
    assert call(lambda: lookup(CgroupRef(NEW_UID, CID))) == PodRef("ml", "trainer-1", "", NEW_UID)
    assert len(kube.list_requests("/api/v1/pods")) == 2


def test_the_old_table_is_kept_while_the_api_fails() -> None:
    answers: list[object] = [
        {"items": [pod(UID, "ml", "trainer-0", "n", {CID: "main"}), "garbage", {"metadata": 7}]},
        {"kind": "Status", "message": "not a list"},
    ]

    def list_pods(_selector: str) -> object:
        answer = answers.pop(0) if answers else None
        if answer is None:
            raise OSError("api server down")
        return answer

    now = [0.0]
    lookup = ApiServerPodLookup(list_pods, "n", ttl_s=30, clock=lambda: now[0])
    assert lookup(CgroupRef(UID, CID)) == PodRef("ml", "trainer-0", "main", UID)
    for t in (100.0, 200.0):  # a non-list answer, then a failure: the table stays
        now[0] = t
        assert lookup(CgroupRef(UID, CID)) == PodRef("ml", "trainer-0", "main", UID)
