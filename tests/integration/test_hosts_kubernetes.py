"""Kubernetes source (raven.kube's reflector) and ConfigMap sink (raven.kube's client too: one
Kubernetes client for the whole hosts generator) against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from coredns_hosts.__main__ import main as hosts_main
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import SinkError
from coredns_hosts.render import parse_hosts
from coredns_hosts.runner import HostsGenerator
from coredns_hosts.sinks.configmap import ConfigMapSink
from coredns_hosts.sinks.file import FileSink
from coredns_hosts.sources.kubernetes import KubernetesSource
from prometheus_client import CollectorRegistry

from raven.kube.client import ApiConfig, KubeClient
from tests.helpers import wait_for
from tests.helpers.fakekube import FakeKube

pytestmark = pytest.mark.integration

EDGE = {"openyurt.io/is-edge-worker": "true"}
EDGE_SELECTOR = "openyurt.io/is-edge-worker=true"
NS, SVC = "kube-system", "raven-gateway"
V4, V6 = ipaddress.ip_address("10.96.0.50"), ipaddress.ip_address("fd00::50")


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    """Served from its own thread: the sink and CLI tests call the client synchronously.
    No periodic bookmarks: the tests send them (``kube.bookmark()``) where they want one."""
    with FakeKube(bookmark_interval_s=3600) as kube:
        yield kube


@pytest.fixture
async def open_sink(kube: FakeKube) -> AsyncIterator[Any]:
    """Makes ConfigMap sinks on the fake API server; closes them (their HTTP sessions)."""
    made: list[ConfigMapSink] = []

    def make(**options: Any) -> ConfigMapSink:
        made.append(ConfigMapSink(KubeClient(ApiConfig(kube.url)), **options))
        return made[-1]

    yield make
    for sink in made:
        await sink.close()


def hosts(path: Path) -> dict[str, frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    try:
        return parse_hosts(path.read_text())
    except FileNotFoundError:
        return {}


class Running:
    def __init__(
        self, kube: FakeKube, out: Path, debounce_s: float = 0.02, **source_kw: int
    ) -> None:
        self.metrics = HostsMetrics(CollectorRegistry())
        self.source = KubernetesSource(
            ApiConfig(kube.url), metrics=self.metrics, service=f"{NS}/{SVC}", **source_kw
        )
        self.out = out
        self.generator = HostsGenerator(
            self.source,
            [FileSink(out)],
            metrics=self.metrics,
            debounce_s=debounce_s,
            max_delay_s=max(0.2, debounce_s * 20),
        )

    def relists(self, resource: str = "nodes") -> float:
        value = self.metrics.registry.get_sample_value(
            "raven_hosts_relists_total", {"resource": resource}
        )
        return value or 0.0

    async def names(self, expected: dict[str, frozenset[object]], what: str) -> None:
        await wait_for(lambda: hosts(self.out) == expected, what)


@contextlib.asynccontextmanager
async def running(kube: FakeKube, out: Path, **kw: Any) -> AsyncIterator[Running]:
    r = Running(kube, out, **kw)
    task = asyncio.create_task(r.generator.run())
    try:
        yield r
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)
        alive = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("watch-")]
        assert alive == [], f"watch tasks left running: {alive}"


def both(*names: str) -> dict[str, frozenset[object]]:
    return {n: frozenset({V4, V6}) for n in names}


async def test_list_then_watch_follows_nodes_relabels_and_service(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    kube.put_service(NS, "other", ["10.96.0.1"])
    kube.put_node("edge-1", EDGE)
    kube.put_node("cloud-1", {"role": "cloud"})
    list_rv = str(kube.resource_version)
    out = tmp_path / "tunnel-nodes"
    async with running(kube, out) as r:
        await r.names(both("edge-1"), "initial list")
        kube.put_node("edge-2", EDGE)
        await r.names(both("edge-1", "edge-2"), "node added")
        kube.put_node("edge-1", {"openyurt.io/is-edge-worker": "false"})
        await r.names(both("edge-2"), "node relabelled out")
        kube.put_node("cloud-1", EDGE)
        await r.names(both("cloud-1", "edge-2"), "node relabelled in")
        kube.delete("nodes", "edge-2")
        await r.names(both("cloud-1"), "node deleted")
        kube.put_service(NS, SVC, ["10.96.0.99"])
        await r.names({"cloud-1": frozenset({ipaddress.ip_address("10.96.0.99")})}, "svc IP")
        assert r.relists("nodes") == 1 and r.relists("services") == 1
        assert "# source: kubernetes nodes openyurt.io/is-edge-worker=true" in out.read_text()
    watch = dict(watch="true", allowWatchBookmarks="true", resourceVersion=list_rv)
    assert kube.count("GET", "/api/v1/nodes", labelSelector=EDGE_SELECTOR, **watch) == 1
    assert kube.count("GET", "/services", fieldSelector=f"metadata.name={SVC}", **watch) == 1


async def test_stream_cut_mid_event_resumes_without_relist(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    kube.put_node("edge-1", EDGE)
    async with running(kube, tmp_path / "hosts") as r:
        await r.names(both("edge-1"), "initial list")
        rv_before = r.source.node_cache.resource_version
        kube.cut_next_event = True
        kube.put_node("edge-cut", EDGE)
        await r.names(both("edge-1", "edge-cut"), "event delivered after the cut")
        assert r.relists("nodes") == 1
        assert kube.count("GET", "/api/v1/nodes", watch="true", resourceVersion=rv_before) == 2


async def test_410_error_event_relists(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    kube.put_node("edge-1", EDGE)
    async with running(kube, tmp_path / "hosts") as r:
        await r.names(both("edge-1"), "initial list")
        kube.expire_watches()
        await wait_for(lambda: r.relists("nodes") == 2, "relist after 410")
        kube.put_node("edge-2", EDGE)
        await r.names(both("edge-1", "edge-2"), "watch after relist")


async def test_cut_while_compacted_gets_410_then_relists(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    kube.put_node("edge-1", EDGE)
    async with running(kube, tmp_path / "hosts") as r:
        await r.names(both("edge-1"), "initial list")
        kube.put_node("cloud-9", {})  # advances the version, invisible to the node watch
        kube.compact()
        kube.cut_next_event = True
        kube.delete("nodes", "edge-1")
        kube.put_node("edge-3", EDGE)
        await r.names(both("edge-3"), "state after relist")
        assert r.relists("nodes") == 2


async def test_bookmark_keeps_resume_point_fresh(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    kube.put_node("edge-1", EDGE)
    async with running(kube, tmp_path / "hosts") as r:
        await r.names(both("edge-1"), "initial list")
        for i in range(5):
            kube.put_node(f"cloud-{i}", {})  # changes the node watch never sees
        bookmark_rv = kube.bookmark()
        await wait_for(lambda: r.source.node_cache.resource_version == str(bookmark_rv), "bookmark")
        kube.compact()  # history before the bookmark is gone
        kube.cut_next_event = True
        kube.put_node("edge-2", EDGE)
        await r.names(both("edge-1", "edge-2"), "resume from the bookmark")
        assert r.relists("nodes") == 1, "a bookmark-fresh version must not need a relist"


async def test_garbage_watch_line_is_skipped(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4)])
    kube.put_node("edge-1", EDGE)
    async with running(kube, tmp_path / "hosts") as r:
        await r.names({"edge-1": frozenset({V4})}, "initial list")
        kube.garbage_next_event = True
        kube.put_node("edge-2", EDGE)
        await r.names({"edge-1": frozenset({V4}), "edge-2": frozenset({V4})}, "after garbage")


async def test_headless_service_keeps_last_good_file(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, ["None"])
    kube.put_node("edge-1", EDGE)
    out = tmp_path / "hosts"
    async with running(kube, out) as r:
        await wait_for(lambda: "no ClusterIP" in (r.generator.last_error or ""), "not ready")
        assert not out.exists() and not r.generator.ready
        kube.put_service(NS, SVC, [str(V4)])
        await r.names({"edge-1": frozenset({V4})}, "service got an IP")
        good = out.read_text()
        kube.put_service(NS, SVC, ["None"])
        kube.put_node("edge-2", EDGE)
        await wait_for(lambda: "no ClusterIP" in (r.generator.last_error or ""), "headless again")
        assert out.read_text() == good
        kube.delete("services", SVC, NS)
        kube.put_node("edge-3", EDGE)
        await wait_for(lambda: r.source.addresses == () and "edge-3" in r.source.nodes, "deleted")
        await wait_for(lambda: "no ClusterIP" in (r.generator.last_error or ""), "svc deleted")
        assert out.read_text() == good


async def test_paged_list_of_many_nodes(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4)])
    for i in range(1200):
        kube.put_node(f"edge-{i:04d}", EDGE)
    async with running(kube, tmp_path / "hosts", page_size=500) as r:
        await wait_for(lambda: len(hosts(r.out)) == 1200, "1200 names", timeout_s=30)
    assert kube.count("GET", "/api/v1/nodes", limit="500") == 3
    assert kube.count("GET", "/api/v1/nodes", limit="500", watch="true") == 0


async def test_expired_continue_token_restarts_the_list(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4)])
    for i in range(700):
        kube.put_node(f"edge-{i:04d}", EDGE)
    kube.expire_next_continue = True  # the second page answers HTTP 410 Expired
    async with running(kube, tmp_path / "hosts", page_size=500) as r:
        await wait_for(lambda: len(hosts(r.out)) == 700, "700 names", timeout_s=30)
        assert r.relists("nodes") == 1  # only the complete list counts
    first_pages = [q for q in kube.requests if q["path"] == "/api/v1/nodes" and "limit" in q]
    assert ["continue" in q for q in first_pages] == [False, True, False, True]


async def test_watch_burst_of_nodes_is_debounced_into_one_write(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4)])
    async with running(kube, tmp_path / "hosts", debounce_s=0.3) as r:
        await wait_for(lambda: r.generator.syncs == 1, "initial (empty) sync")
        for i in range(2000):
            kube.put_node(f"edge-{i:04d}", EDGE)
        await wait_for(lambda: len(hosts(r.out)) == 2000, "2000 names", timeout_s=30)
        await asyncio.sleep(0.4)
        writes = r.metrics.registry.get_sample_value("raven_hosts_writes_total", {"sink": "file"})
        assert writes == 2, "2000 watch events must give one write (plus the initial one)"
        assert r.relists("nodes") == 1


async def test_configmap_create_replace_and_unchanged(kube, open_sink) -> None:
    sink = open_sink()
    assert await sink.write("10.96.0.50 edge-1\n") is True
    cm = kube.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None and cm["data"] == {"tunnel-nodes": "10.96.0.50 edge-1\n"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "raven-coredns-hosts"
    cm["data"]["other"] = "kept"  # someone else adds a key
    kube.put("configmaps", cm, "kube-system")
    assert await sink.write("10.96.0.50 edge-1\n") is False
    assert kube.count("PUT", "/configmaps/") == 0
    assert await sink.write("10.96.0.50 edge-2\n") is True
    cm = kube.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None
    assert cm["data"] == {"tunnel-nodes": "10.96.0.50 edge-2\n", "other": "kept"}
    assert kube.count("POST", "/configmaps") == 1 and kube.count("PUT", "/configmaps/") == 1


async def test_configmap_conflicts_are_retried(kube, open_sink) -> None:
    sleeps: list[float] = []

    async def record(seconds: float) -> None:
        sleeps.append(seconds)

    sink = open_sink(sleep=record)
    await sink.write("a\n")
    kube.conflicts_to_inject = 3
    assert await sink.write("b\n") is True
    assert sink.conflicts == 3 and len(sleeps) == 3
    cm = kube.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None and cm["data"]["tunnel-nodes"] == "b\n"


async def test_configmap_conflict_storm_gives_clear_error(kube, open_sink) -> None:
    sink = open_sink(sleep=no_pause, max_attempts=5)
    await sink.write("good\n")
    kube.conflicts_to_inject = 10_000
    with pytest.raises(SinkError, match="still conflicting after 5 attempts"):
        await sink.write("new\n")
    cm = kube.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None and cm["data"]["tunnel-nodes"] == "good\n"
    assert kube.count("PUT", "/configmaps/") == 5  # first write was a create (POST)


async def test_configmap_api_error_is_a_sink_error(kube, open_sink) -> None:
    kube.forbidden_namespaces.add("locked")
    sink = open_sink(namespace="locked")
    with pytest.raises(SinkError, match="ConfigMap locked/edge-tunnel-nodes: API error HTTP 403"):
        await sink.write("a\n")


def test_cli_once_with_kubeconfig_writes_file_and_configmap(kube, tmp_path) -> None:
    kube.put_service(NS, SVC, [str(V4), str(V6)])
    for name in ("edge-b", "edge-a", "Bad_Name"):
        kube.put_node(name, EDGE)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: fake, cluster: {{server: '{kube.url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: fake, user: u}}]\ncurrent-context: c\n"
    )
    out = tmp_path / "tunnel-nodes"
    argv = [
        "run",
        "--once",
        "--kubeconfig",
        str(kubeconfig),
        "--service",
        f"{NS}/{SVC}",
        "--output",
        str(out),
        "--configmap",
    ]
    assert hosts_main(argv) == 0
    assert parse_hosts(out.read_text()) == both("edge-a", "edge-b")
    cm = kube.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None and cm["data"]["tunnel-nodes"] == out.read_text()
    kube.put_service(NS, SVC, ["None"])
    assert hosts_main(argv) == 1  # headless: refused, last good kept
    assert parse_hosts(out.read_text()) == both("edge-a", "edge-b")


async def no_pause(_seconds: float) -> None:
    return None
