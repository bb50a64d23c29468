"""KubernetesNodeWatcher (raven.kube's reflector) against tests/helpers/fakekube/ over real HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from edge_agent.nodes_k8s import KubernetesNodeWatcher, start_node_source
from raven.config.agent import KubernetesNodeSource
from raven.kube.client import ApiConfig, KubeClient
from tests.helpers import KeyPair, agent_config, gateway_config, wait_for
from tests.helpers.apps import gateway_and_agent
from tests.helpers.fakekube import FakeKube, make_node
from tests.helpers.kube import write_kubeconfig

pytestmark = pytest.mark.integration

EDGE = {"raven.io/site": "a"}
OTHER = {"raven.io/site": "b"}
SELECTOR = "raven.io/site=a"


class Recorder:
    """Collects every table the watcher reports and waits for a wanted one."""

    def __init__(self) -> None:
        self.tables: list[dict[str, str]] = []
        self._cond = asyncio.Condition()

    async def __call__(self, table: dict[str, str]) -> None:
        async with self._cond:
            self.tables.append(table)
            self._cond.notify_all()

    @property
    def last(self) -> dict[str, str] | None:
        return self.tables[-1] if self.tables else None

    async def wait_for(
        self, want: dict[str, str] | Callable[[dict[str, str]], bool], timeout_s: float = 5.0
    ) -> dict[str, str]:
        def ok() -> bool:
            if self.last is None:
                return False
            return want(self.last) if callable(want) else self.last == want

        async with asyncio.timeout(timeout_s):
            async with self._cond:
                await self._cond.wait_for(ok)
        assert self.last is not None
        return self.last


class Harness:
    def __init__(
        self, kube: FakeKube, rec: Recorder, watcher: KubernetesNodeWatcher, listed_rv: int
    ) -> None:
        self.listed_rv = listed_rv
        self.kube = kube
        self.rec = rec
        self.watcher = watcher


def _api_client(kube: FakeKube) -> KubeClient:
    return KubeClient(ApiConfig(kube.url), connect_timeout_s=2.0)


async def _start(
    kube: FakeKube, rec: Recorder, **kwargs: Any
) -> tuple[KubernetesNodeWatcher, asyncio.Task[None], Any]:
    api = _api_client(kube)
    opts: dict[str, Any] = {
        "debounce_s": 0.05,
        "min_backoff_s": 0.05,
        "max_backoff_s": 0.2,
        "watch_timeout_s": (30, 30),
    }
    opts.update(kwargs)
    watcher = KubernetesNodeWatcher(api, SELECTOR, rec, **opts)
    task = asyncio.create_task(watcher.run())
    return watcher, task, api


async def _stop(task: asyncio.Task[None], api: Any) -> None:
    task.cancel()
    # a hang detector, not a timing assertion: a watcher that ignores cancellation never ends
    done, _ = await asyncio.wait({task}, timeout=30)
    assert done, "cancelling the watcher must not hang"
    with pytest.raises(asyncio.CancelledError):
        await task
    await api.close()


@pytest.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    marker = request.node.get_closest_marker("fakekube")
    kube_kwargs = marker.kwargs if marker else {}
    async with FakeKube(**kube_kwargs) as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        kube.put_node("cloud-1", OTHER, "10.0.0.1")
        listed_rv = kube.resource_version
        rec = Recorder()
        watcher, task, api = await _start(kube, rec)
        await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
        yield Harness(kube, rec, watcher, listed_rv)
        await _stop(task, api)


async def _watching(kube: FakeKube, n: int = 1) -> None:
    """Wait until ``n`` watch requests have been made and one is open."""
    async with asyncio.timeout(5):
        while len(kube.watch_requests()) < n or kube.open_watches == 0:
            await asyncio.sleep(0.02)


async def test_add_remove_relabel_and_address_change(harness: Harness) -> None:
    kube, rec = harness.kube, harness.rec
    await _watching(kube)
    kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
    await rec.wait_for({"edge-gpu-1": "192.168.1.10", "edge-gpu-2": "192.168.1.11"})
    kube.delete("nodes", "edge-gpu-1")
    await rec.wait_for({"edge-gpu-2": "192.168.1.11"})
    kube.put_node("edge-gpu-2", EDGE, "192.168.1.99")
    await rec.wait_for({"edge-gpu-2": "192.168.1.99"})
    kube.relabel("nodes", "edge-gpu-2", OTHER)
    await rec.wait_for({})
    kube.relabel("nodes", "cloud-1", EDGE)
    await rec.wait_for({"cloud-1": "10.0.0.1"})

    # One list, then watches from its resourceVersion with bookmarks and the selector.
    assert len(kube.list_requests()) == 1
    first_watch = kube.watch_requests()[0]
    assert first_watch["labelSelector"] == SELECTOR
    assert first_watch["allowWatchBookmarks"] == "true"
    assert first_watch["resourceVersion"] == str(harness.listed_rv)
    assert "timeoutSeconds" in first_watch


async def test_ipv4_preferred_ipv6_fallback_and_no_address(harness: Harness) -> None:
    kube, rec = harness.kube, harness.rec
    await _watching(kube)
    kube.put_node("dual", EDGE, ["fd00::5", "10.1.0.5"])
    kube.put_node("v6only", EDGE, ["fd00::6"])
    kube.put("nodes", make_node("noaddr", EDGE))
    kube.put(
        "nodes",
        make_node(
            "extonly", EDGE, extra_addresses=[{"type": "ExternalIP", "address": "203.0.113.9"}]
        ),
    )
    await rec.wait_for({"dual": "10.1.0.5", "edge-gpu-1": "192.168.1.10", "v6only": "fd00::6"})
    # A node that loses its InternalIP is no longer served.
    kube.put("nodes", make_node("dual", EDGE))
    await rec.wait_for({"edge-gpu-1": "192.168.1.10", "v6only": "fd00::6"})


async def test_stream_cut_resumes_from_resource_version_without_relist(harness: Harness) -> None:
    kube, rec, watcher = harness.kube, harness.rec, harness.watcher
    await _watching(kube)
    kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
    await rec.wait_for(lambda t: "edge-gpu-2" in t)
    rv_before = int(watcher.resource_version or 0)
    kube.cut_watches()
    kube.put_node("edge-gpu-3", EDGE, "192.168.1.12")  # while no watch is open
    await rec.wait_for(lambda t: "edge-gpu-3" in t)
    assert len(kube.list_requests()) == 1, "a cut stream resumes the watch, it does not relist"
    resumed = kube.watch_requests()[-1]
    assert int(resumed["resourceVersion"]) >= rv_before


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_410_gone_relists(gone_as_http: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raven.kube")
    async with FakeKube(gone_as_http=gone_as_http, bookmark_interval_s=60) as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        rec = Recorder()
        _, task, api = await _start(kube, rec)
        try:
            await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
            await _watching(kube)
            # Changes the watcher misses, then the history is compacted away and the stream cut:
            # resuming from its resourceVersion gets 410 Gone, so it must relist.
            kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
            kube.delete("nodes", "edge-gpu-1")
            kube.compact()
            kube.cut_watches()
            await rec.wait_for({"edge-gpu-2": "192.168.1.11"})
            assert len(kube.list_requests()) == 2
            assert "relisting" in caplog.text
            # And it watches on after the relist.
            await _watching(kube, n=3)
            kube.put_node("edge-gpu-3", EDGE, "192.168.1.12")
            await rec.wait_for(lambda t: "edge-gpu-3" in t)
        finally:
            await _stop(task, api)


async def test_410_error_event_on_open_stream_relists(harness: Harness) -> None:
    kube, rec = harness.kube, harness.rec
    await _watching(kube)
    kube.send_error_event(410, "Expired", "too old resource version: 1 (200)")
    await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
    async with asyncio.timeout(5):
        while len(kube.list_requests()) < 2:
            await asyncio.sleep(0.02)


async def test_bookmark_advances_resource_version(harness: Harness) -> None:
    kube, watcher = harness.kube, harness.watcher
    await _watching(kube)
    # A change the selector hides: only a bookmark can tell the watcher about its version.
    rv = kube.put_node("cloud-2", OTHER, "10.0.0.2")
    async with asyncio.timeout(5):
        while watcher.resource_version != str(rv):
            await asyncio.sleep(0.05)
    # Compacting up to the bookmarked version does not force a relist.
    kube.compact()
    kube.cut_watches()
    await _watching(kube, n=2)
    kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
    await harness.rec.wait_for(lambda t: "edge-gpu-2" in t)
    assert len(kube.list_requests()) == 1
    assert kube.watch_requests()[1]["resourceVersion"] == str(rv)


async def test_garbage_is_skipped_with_a_warning(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="raven.kube")
    kube, rec = harness.kube, harness.rec
    await _watching(kube)
    kube.inject_raw(b"this is not json")
    kube.inject_raw(b'["a", "list"]')
    kube.inject_raw(json.dumps({"type": "ADDED", "object": "a string"}).encode())
    kube.inject_raw(json.dumps({"type": "ADDED", "object": {"metadata": 5}}).encode())
    bad_name = make_node("Bad_Name!", EDGE, internal_ips=["192.168.1.50"])
    kube.inject_raw(json.dumps({"type": "ADDED", "object": bad_name}).encode())
    bad_status = make_node("edge-gpu-9", EDGE)
    bad_status["status"]["addresses"] = "192.168.1.9"
    kube.inject_raw(json.dumps({"type": "MODIFIED", "object": bad_status}).encode())
    kube.inject_raw(json.dumps({"type": "EXPLODED", "object": {}}).encode())
    kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
    table = await rec.wait_for(lambda t: "edge-gpu-2" in t)
    assert table == {"edge-gpu-1": "192.168.1.10", "edge-gpu-2": "192.168.1.11"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) >= 7
    assert all(r.exc_info is None for r in warnings), "garbage is one line, never a traceback"
    assert len(kube.list_requests()) == 1


async def test_garbage_in_list_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raven.kube")
    async with FakeKube() as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        broken = make_node("edge-gpu-2", EDGE, internal_ips=["192.168.1.11"])
        broken["metadata"]["name"] = ["not", "a", "name"]
        kube._objects[("nodes", "", "edge-gpu-2")] = broken  # bypasses put()'s bookkeeping
        broken["metadata"]["resourceVersion"] = "1"
        rec = Recorder()
        _, task, api = await _start(kube, rec)
        try:
            await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
            assert "skipping garbage object in list" in caplog.text
        finally:
            await _stop(task, api)


async def test_api_errors_back_off_and_recover(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raven.kube")
    async with FakeKube() as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        kube.fail_requests = 3
        rec = Recorder()
        _, task, api = await _start(kube, rec)
        try:
            await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
            assert caplog.text.count("retrying in") >= 3
            assert len(kube.list_requests()) == 4
        finally:
            await _stop(task, api)


async def test_unreachable_server_keeps_retrying_then_connects() -> None:
    async with FakeKube() as kube:
        port = kube.port
    # Nothing listens on `port` now: the watcher must keep retrying, not crash.
    rec = Recorder()
    api = KubeClient(ApiConfig(f"http://127.0.0.1:{port}"))
    watcher = KubernetesNodeWatcher(
        api, SELECTOR, rec, debounce_s=0.05, min_backoff_s=0.05, max_backoff_s=0.1
    )
    task = asyncio.create_task(watcher.run())
    await asyncio.sleep(0.5)
    assert not task.done()
    assert rec.tables == []
    await _stop(task, api)


async def test_debounce_coalesces_bursts(harness: Harness) -> None:
    kube, rec = harness.kube, harness.rec
    await _watching(kube)
    before = len(rec.tables)
    for i in range(20):
        kube.put_node(f"burst-{i}", EDGE, f"192.168.2.{i + 1}")
    await rec.wait_for(lambda t: len(t) == 21)
    assert len(rec.tables) - before <= 3


async def test_start_node_source_with_kubeconfig(tmp_path: Path) -> None:
    """The agent's entry point: a kubeconfig file from the config, first table awaited."""
    async with FakeKube() as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        kubeconfig = write_kubeconfig(tmp_path, {"server": kube.url})
        rec = Recorder()
        cfg = KubernetesNodeSource(enabled=True, label_selector=SELECTOR, kubeconfig=kubeconfig)
        source = await start_node_source(cfg, rec, debounce_s=0.05)
        try:
            assert rec.tables == [{"edge-gpu-1": "192.168.1.10"}]
            assert source.nodes == {"edge-gpu-1": "192.168.1.10"}
            kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
            await rec.wait_for(lambda t: "edge-gpu-2" in t)
        finally:
            await source.stop()
        assert source.task.done()


async def test_start_node_source_bad_credentials_fail_clearly(tmp_path: Path) -> None:
    cfg = KubernetesNodeSource(enabled=True, kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="kubernetes: cannot load credentials"):
        await start_node_source(cfg, Recorder())


async def test_agent_registers_kubernetes_nodes_at_the_gateway(tmp_path: Path) -> None:
    """A node added to the site in Kubernetes is served and registered within seconds; one
    relabelled out of the site is withdrawn (AgentApp + GatewayApp on loopback)."""
    async with FakeKube() as kube:
        kube.put_node("edge-k8s-1", EDGE, "127.0.0.1")
        kubeconfig = write_kubeconfig(tmp_path, {"server": kube.url})
        gw_key, agent_key = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "agent")
        agents = [{"name": "site-a", "public_key": agent_key.public_b64, "nodes": ["edge-k8s-*"]}]
        kubernetes = {"enabled": True, "label_selector": SELECTOR, "kubeconfig": kubeconfig}
        apps = gateway_and_agent(
            gateway_config(tmp_path, gw_key, agents),
            lambda address: agent_config(agent_key, gw_key, address, {}, kubernetes=kubernetes),
        )
        async with apps as (gateway, agent):

            def registered() -> set[str]:
                nodes: Any = gateway.registry.nodes_json()["nodes"]
                return {n["node"] for n in nodes if n["reachable"]}

            await wait_for(lambda: registered() == {"edge-k8s-1"}, timeout_s=10)
            kube.put_node("edge-k8s-2", EDGE, "127.0.0.1")
            await wait_for(lambda: registered() == {"edge-k8s-1", "edge-k8s-2"}, timeout_s=10)
            kube.relabel("nodes", "edge-k8s-1", OTHER)
            await wait_for(lambda: registered() == {"edge-k8s-2"}, timeout_s=10)
            assert agent.relay.nodes == {"edge-k8s-2": "127.0.0.1"}


async def test_410_on_every_watch_backs_off_instead_of_spinning() -> None:
    async with FakeKube() as kube:
        kube.put_node("edge-gpu-1", EDGE, "192.168.1.10")
        kube.expire_every_watch = True
        rec = Recorder()
        watcher, task, api = await _start(kube, rec, min_backoff_s=0.1, max_backoff_s=0.4)
        try:
            await rec.wait_for({"edge-gpu-1": "192.168.1.10"})
            schedule = watcher.reflector.schedule
            async with asyncio.timeout(10):
                while len(kube.list_requests()) < 4:
                    await asyncio.sleep(0.02)
            # 410s in a row count up and every relist after the first waits a backoff
            # (Schedule.gone, unit-tested on a hand clock) instead of spinning.
            assert schedule.gone_streak >= 3
            # The table stays served meanwhile, and changes still arrive through the relists.
            kube.put_node("edge-gpu-2", EDGE, "192.168.1.11")
            await rec.wait_for(lambda t: "edge-gpu-2" in t)
        finally:
            await _stop(task, api)
